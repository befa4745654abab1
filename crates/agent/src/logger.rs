//! ternd's log lines: `env_logger` on stderr, one line per record with an RFC 3339 timestamp
//! (UTC, milliseconds), the level and the module that logged it:
//! `[2026-12-01T08:00:00.123Z INFO  tern_agent::pod::add] ADD default/web: 10.244.0.3/32`.

/// Installs the logger. `filter` is a level (`error`, `warn`, `info`, `debug`, `trace`) or an
/// env_logger filter (`info,tern_agent::bgp=debug`); `TERN_LOG`, when set, overrides it.
pub fn init(filter: &str) {
    let mut b = builder(filter);
    if let Ok(env) = std::env::var("TERN_LOG") {
        b.parse_filters(&env);
    }
    let _ = b.try_init();
}

fn builder(filter: &str) -> env_logger::Builder {
    let mut b = env_logger::Builder::new();
    b.parse_filters(filter)
        .format_timestamp_millis()
        .target(env_logger::Target::Stderr);
    b
}

/// Formats one record as [`init`] does, into `out` (for tests).
#[cfg(test)]
fn format_into(filter: &str, out: std::sync::Arc<std::sync::Mutex<Vec<u8>>>) -> env_logger::Logger {
    use std::io::Write;
    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut b = builder(filter);
    b.target(env_logger::Target::Pipe(Box::new(Sink(out))));
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::Log;

    #[test]
    fn lines_carry_an_rfc3339_timestamp_level_and_module() {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let logger = format_into("info", buf.clone());
        let log = |level: log::Level, msg: &str| {
            logger.log(
                &log::Record::builder()
                    .level(level)
                    .target("tern_agent::pod::add")
                    .args(format_args!("{msg}"))
                    .build(),
            )
        };
        log(log::Level::Warn, "ADD failed");
        log(log::Level::Debug, "hidden");
        let text = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        let line = text.lines().next().expect("one line");
        assert_eq!(text.lines().count(), 1, "debug is filtered out: {text}");
        // [2026-12-01T08:00:00.123Z WARN  tern_agent::pod::add] ADD failed
        let ts = &line[1..25];
        assert_eq!(ts.len(), 24, "{line}");
        assert_eq!(&ts[4..5], "-", "{line}");
        assert_eq!(&ts[10..11], "T", "{line}");
        assert_eq!(&ts[19..20], ".", "{line}");
        assert!(ts.ends_with('Z'), "{line}");
        assert!(line.contains("WARN"), "{line}");
        assert!(line.contains("tern_agent::pod::add] ADD failed"), "{line}");
    }
}
