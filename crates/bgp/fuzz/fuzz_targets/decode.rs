//! `cargo +nightly fuzz run decode` from `crates/bgp`: the decoder and framer must never panic,
//! and anything that decodes must survive an encode/decode round trip unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tern_bgp::codec::{CodecOptions, Framer, decode_with, encode_with};

fuzz_target!(|data: &[u8]| {
    for four_octet_as in [true, false] {
        let opts = CodecOptions { four_octet_as };
        if let Ok(m) = decode_with(data, opts) {
            let again = encode_with(&m, opts);
            assert_eq!(decode_with(&again, opts).ok(), Some(m));
        }
    }
    let mut framer = Framer::new();
    framer.push(data);
    while let Ok(Some(frame)) = framer.next_frame() {
        let _ = decode_with(&frame, CodecOptions::default());
    }
});
