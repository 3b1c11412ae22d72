//! Watches the first bytes an HBONE server reads: the client preface and the SETTINGS frame
//! that must follow it (RFC 9113 §3.4), so the server can bound how long a peer takes to send
//! them. h2 itself waits for the preface without a deadline and does not check that the first
//! frame is SETTINGS.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`.
const PREFACE_LEN: usize = 24;
/// An HTTP/2 frame header: 24-bit length, type, flags, stream id.
const FRAME_HEADER_LEN: usize = 9;
const SETTINGS_FRAME_TYPE: u8 = 0x4;

/// Wraps the server's transport; sets `settings_seen` once the preface and a whole SETTINGS
/// frame have been read, and fails the read if the first frame is anything else. After that it
/// only forwards.
pub(crate) struct PrefaceWatch<IO> {
    io: IO,
    /// The preface and the first frame header, as read so far.
    head: [u8; PREFACE_LEN + FRAME_HEADER_LEN],
    /// Bytes read so far, until the SETTINGS frame is complete.
    read: usize,
    /// Total bytes up to the end of the first SETTINGS frame, once its header is known.
    settings_end: Option<usize>,
    settings_seen: Arc<AtomicBool>,
}

impl<IO> PrefaceWatch<IO> {
    pub(crate) fn new(io: IO) -> (Self, Arc<AtomicBool>) {
        let seen = Arc::new(AtomicBool::new(false));
        let watch = Self {
            io,
            head: [0; PREFACE_LEN + FRAME_HEADER_LEN],
            read: 0,
            settings_end: None,
            settings_seen: seen.clone(),
        };
        (watch, seen)
    }

    fn done(&self) -> bool {
        self.settings_end.is_some_and(|end| self.read >= end)
    }

    /// Accounts for `new` bytes just read.
    fn observe(&mut self, new: &[u8]) -> io::Result<()> {
        let head_len = self.head.len();
        if self.read < head_len {
            let n = new.len().min(head_len - self.read);
            self.head[self.read..self.read + n].copy_from_slice(&new[..n]);
        }
        self.read = self.read.saturating_add(new.len());
        if self.settings_end.is_none() && self.read >= head_len {
            let frame = &self.head[PREFACE_LEN..];
            if frame[3] != SETTINGS_FRAME_TYPE {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "first HTTP/2 frame from the peer has type {:#x}, not SETTINGS",
                        frame[3]
                    ),
                ));
            }
            let len =
                usize::from(frame[0]) << 16 | usize::from(frame[1]) << 8 | usize::from(frame[2]);
            self.settings_end = Some(head_len + len);
        }
        if self.done() {
            self.settings_seen.store(true, Ordering::Release);
        }
        Ok(())
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for PrefaceWatch<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.done() {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        let res = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = res {
            let new = &buf.filled()[before..];
            if let Err(e) = this.observe(new) {
                // h2 must not act on a frame we refuse.
                buf.set_filled(before);
                return Poll::Ready(Err(e));
            }
        }
        res
    }
}

write_through!(PrefaceWatch);

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn settings(payload_len: usize) -> Vec<u8> {
        let mut f = vec![
            (payload_len >> 16) as u8,
            (payload_len >> 8) as u8,
            payload_len as u8,
            SETTINGS_FRAME_TYPE,
            0,
            0,
            0,
            0,
            0,
        ];
        f.extend(std::iter::repeat_n(0u8, payload_len));
        f
    }

    #[test]
    fn settings_is_seen_only_once_complete_whatever_the_read_sizes() {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(settings(12));
        bytes.extend(b"more frames");
        for step in [1, 2, 7, 24, 33, 44, 100] {
            let (mut w, seen) = PrefaceWatch::new(());
            let end = PREFACE_LEN + FRAME_HEADER_LEN + 12;
            let mut at = 0;
            while at < bytes.len() {
                let n = step.min(bytes.len() - at);
                w.observe(&bytes[at..at + n]).unwrap();
                at += n;
                assert_eq!(
                    seen.load(Ordering::Acquire),
                    at >= end,
                    "step {step}, at {at}"
                );
            }
        }
    }

    #[test]
    fn a_first_frame_other_than_settings_is_refused() {
        let mut bytes = PREFACE.to_vec();
        let mut headers = settings(0);
        headers[3] = 0x1; // HEADERS
        bytes.extend(headers);
        let (mut w, seen) = PrefaceWatch::new(());
        let err = w.observe(&bytes).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(!seen.load(Ordering::Acquire));
    }
}
