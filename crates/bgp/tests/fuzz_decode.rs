//! Decodes tens of thousands of random and mutated byte strings: the decoder and framer must
//! return (never panic), and whatever decodes must re-encode to something that decodes equal.

use tern_bgp::codec::{CodecOptions, Framer, decode_with, encode_with};

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let dir = format!("{}/tests/fixtures", env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let digits: String = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or(""))
            .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
            .collect();
        out.push(
            (0..digits.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
                .collect(),
        );
    }
    out
}

fn check(bytes: &[u8], opts: CodecOptions) -> bool {
    match decode_with(bytes, opts) {
        Ok(m) => {
            let again = encode_with(&m, opts);
            assert_eq!(decode_with(&again, opts).as_ref(), Ok(&m), "{bytes:02x?}");
            true
        }
        Err(_) => false,
    }
}

#[test]
fn random_and_mutated_inputs_never_panic() {
    let seeds = seeds();
    assert!(seeds.len() >= 10);
    let mut rng = Rng(0x7e2d_b6a1_0c55_e3f1);
    let mut decoded = 0;
    for i in 0..60_000 {
        let opts = CodecOptions {
            four_octet_as: i % 3 != 0,
        };
        let mut m = seeds[rng.below(seeds.len())].clone();
        match i % 4 {
            // Pure noise behind a valid marker, with a consistent length field half the time.
            0 => {
                let n = 19 + rng.below(200);
                m = (0..n).map(|_| rng.next() as u8).collect();
                m[..16].fill(0xff);
                if rng.below(2) == 0 {
                    m[16..18].copy_from_slice(&(n as u16).to_be_bytes());
                }
            }
            // Flip a few octets past the marker.
            1 | 2 => {
                for _ in 0..1 + rng.below(4) {
                    let at = 16 + rng.below(m.len() - 16);
                    m[at] = rng.next() as u8;
                }
            }
            // Truncate or extend, then fix the length field so the body is parsed.
            _ => {
                let n = 19 + rng.below(m.len() + 8);
                m.resize(n, rng.next() as u8);
                m[16..18].copy_from_slice(&(n as u16).to_be_bytes());
            }
        }
        if check(&m, opts) {
            decoded += 1;
        }
        let mut f = Framer::new();
        f.push(&m);
        while let Ok(Some(frame)) = f.next_frame() {
            let _ = decode_with(&frame, opts);
        }
    }
    // The mutations must reach past the header checks often enough to mean something.
    assert!(decoded > 5_000, "only {decoded} inputs decoded");
}
