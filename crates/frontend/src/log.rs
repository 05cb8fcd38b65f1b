//! Logging from inside someone else's process: to stderr, prefixed, at a
//! level set by `GPUPLEX_LOG` (error, warn, info, debug; default warn).

use std::sync::OnceLock;

#[derive(PartialEq, PartialOrd, Clone, Copy)]
enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| match std::env::var("GPUPLEX_LOG").as_deref() {
        Ok("error") => Level::Error,
        Ok("info") => Level::Info,
        Ok("debug") => Level::Debug,
        _ => Level::Warn,
    })
}

fn emit(at: Level, tag: &str, msg: &str) {
    if at <= level() {
        eprintln!("gpuplex[{}] {tag}: {msg}", std::process::id());
    }
}

pub fn error(msg: &str) {
    emit(Level::Error, "error", msg);
}

pub fn warn(msg: &str) {
    emit(Level::Warn, "warning", msg);
}

pub fn info(msg: &str) {
    emit(Level::Info, "info", msg);
}

pub fn debug(msg: &str) {
    emit(Level::Debug, "debug", msg);
}
