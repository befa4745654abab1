//! Splits a TCP byte stream into whole BGP messages.

use super::HEADER_LEN;
use super::decode::{DecodeError, check_header};

/// Accumulates stream bytes and yields complete messages (header included).
///
/// The header is validated as soon as 19 octets are present, so a desynchronised stream fails
/// with Connection Not Synchronized and an impossible length with Bad Message Length (data: the
/// length) before the body arrives. After an error the framer stays failed: a stream that lost
/// framing cannot be trusted again.
#[derive(Debug, Default)]
pub struct Framer {
    buf: Vec<u8>,
    failed: Option<DecodeError>,
}

impl Framer {
    /// An empty framer.
    pub fn new() -> Framer {
        Framer::default()
    }

    /// Appends bytes read from the socket.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_none() {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// Octets buffered but not yet returned.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete message, `Ok(None)` if more bytes are needed, or the header error.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, DecodeError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let Some(header) = self.buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let (len, _) = match check_header(header) {
            Ok(v) => v,
            Err(e) => {
                self.failed = Some(e.clone());
                self.buf.clear();
                return Err(e);
            }
        };
        if self.buf.len() < len {
            return Ok(None);
        }
        let rest = self.buf.split_off(len);
        Ok(Some(std::mem::replace(&mut self.buf, rest)))
    }
}
