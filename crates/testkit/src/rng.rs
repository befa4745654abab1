//! A seeded random number generator for tests that generate their inputs: xorshift64*, small,
//! dependency-free and the same on every machine, so a failure names a seed that reproduces it.

/// xorshift64* (the seed must not be zero).
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    /// One of `xs` (which must not be empty).
    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    /// The sequence is fixed by the seed, and `below` stays in range.
    #[test]
    fn seeded_and_in_range() {
        let (mut a, mut b) = (Rng(7), Rng(7));
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs[0], xs[1]);
        assert!((0..1000).all(|_| a.below(3) < 3));
        assert_eq!(a.below(0), 0);
    }
}
