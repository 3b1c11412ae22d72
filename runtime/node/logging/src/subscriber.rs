//! Logging: tracing to stderr (text or JSON) through a buffer a writer thread empties (see [`crate::writer`]),
//! with a filter that `/logging` can change at run time.

use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

use crate::LogFormat;
use crate::error::LogError;
use crate::json::{JsonLine, JsonSpanFields};
use crate::writer::{BufferedWriter, LogBuffer, LogFlush};

/// Handle to change the log filter.
#[derive(Clone)]
pub struct LogControl {
    handle: reload::Handle<EnvFilter, Registry>,
}

impl std::fmt::Debug for LogControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogControl").finish_non_exhaustive()
    }
}

impl LogControl {
    /// The current filter.
    pub fn current(&self) -> String {
        self.handle
            .with_current(|f| f.to_string())
            .unwrap_or_else(|e| format!("unknown ({e})"))
    }

    /// Replace the filter.
    pub fn set(&self, filter: &str) -> Result<String, String> {
        let f = EnvFilter::try_new(filter).map_err(|e| format!("bad filter {filter:?}: {e}"))?;
        self.handle.reload(f).map_err(|e| e.to_string())?;
        Ok(self.current())
    }
}

/// Whether text lines get terminal colours: only on a terminal, and not when `NO_COLOR` is set to anything
/// non-empty (no-color.org). stderr is a pipe under a container runtime or systemd, where escape codes would be
/// stored in every line an operator reads back with `kubectl logs` or greps.
fn colours(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Install the global subscriber. Keep the returned guard until the end: dropping it writes the lines still
/// buffered. A panic writes them before its own message.
pub fn init(
    filter: &str,
    format: LogFormat,
    linger: std::time::Duration,
) -> Result<(LogControl, LogFlush), LogError> {
    let filter = EnvFilter::try_new(filter).map_err(|e| LogError::BadFilter {
        filter: filter.to_owned(),
        reason: e.to_string(),
    })?;
    let (layer, handle) = reload::Layer::new(filter);
    let (buffer, flush) = LogBuffer::start(std::io::stderr(), linger)?;
    let writer = BufferedWriter(buffer);
    let reg = tracing_subscriber::registry().with(layer);
    match format {
        LogFormat::Text => reg
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(colours(
                        std::io::stderr().is_terminal(),
                        std::env::var_os("NO_COLOR"),
                    ))
                    .with_writer(writer),
            )
            .try_init()?,
        LogFormat::Json => reg
            .with(
                tracing_subscriber::fmt::layer()
                    .event_format(JsonLine)
                    .fmt_fields(JsonSpanFields)
                    .with_writer(writer),
            )
            .try_init()?,
    }
    let flusher = flush.flusher();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        flusher();
        previous(info);
    }));
    Ok((LogControl { handle }, flush))
}

#[cfg(test)]
mod tests {
    use super::colours;

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        assert!(colours(true, None));
        assert!(colours(true, Some("".into())));
        assert!(!colours(true, Some("1".into())));
        assert!(!colours(false, None));
        assert!(!colours(false, Some("".into())));
    }
}
