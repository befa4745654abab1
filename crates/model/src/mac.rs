//! A MAC address as a value: parsed once from its text ("aa:bb:cc:dd:ee:ff", either case) where
//! a record or request is read, written back lower case; a bad one is an error naming it.

use std::fmt;
use std::str::FromStr;

/// An Ethernet (EUI-48) address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

/// A string that is not six colon-separated hex octets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a MAC address (six hex octets separated by colons)")]
pub struct BadMac(pub String);

impl MacAddr {
    /// The six octets.
    pub fn octets(self) -> [u8; 6] {
        self.0
    }
}

impl FromStr for MacAddr {
    type Err = BadMac;

    fn from_str(s: &str) -> Result<MacAddr, BadMac> {
        let bad = || BadMac(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in out.iter_mut() {
            let p = parts.next().ok_or_else(bad)?;
            if p.len() != 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(out))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(o: [u8; 6]) -> MacAddr {
        MacAddr(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_either_case_and_writes_lower_case() {
        let m: MacAddr = "EE:ee:ee:ee:ee:01".parse().unwrap();
        assert_eq!(m.octets(), [0xee, 0xee, 0xee, 0xee, 0xee, 0x01]);
        assert_eq!(m.to_string(), "ee:ee:ee:ee:ee:01");
        assert_eq!(
            MacAddr::from([0x0a, 0x58, 0, 0, 0, 1]).to_string(),
            "0a:58:00:00:00:01"
        );
    }

    #[test]
    fn a_bad_one_is_an_error_naming_it() {
        for bad in [
            "",
            "ee:ee",
            "ee:ee:ee:ee:ee:ee:ee",
            "zz:ee:ee:ee:ee:ee",
            "e:ee:ee:ee:ee:eee",
            "+e:ee:ee:ee:ee:ee",
        ] {
            let e = bad.parse::<MacAddr>().unwrap_err();
            assert_eq!(e, BadMac(bad.to_string()));
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }
}
