//! Tests only: an HTTP proxy in front of a local emulator that forwards every request and, for
//! the requests a predicate picks, throws the emulator's answer away and answers `503`
//! instead. That is a write which reached the store but whose answer was lost, so the
//! backend retries it and meets its own object (the case the conditional writes of every
//! object-store backend have to recognise). Used by the S3, Azure and GCS tests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// A running proxy; its threads end with the test process.
pub(crate) struct LossyProxy {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Answers thrown away so far.
    pub lost: Arc<AtomicU32>,
}

/// Starts a proxy to `upstream` (`127.0.0.1:8333`) that loses the answers of the requests
/// whose request line (`PUT /b/k?x=y HTTP/1.1`) `pick` says true of (called once per request,
/// in the order they arrive).
pub(crate) fn start(
    upstream: &str,
    pick: impl Fn(&str) -> bool + Send + Sync + 'static,
) -> LossyProxy {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let url = format!("http://{}", listener.local_addr().expect("proxy address"));
    let lost = Arc::new(AtomicU32::new(0));
    let (upstream, pick, counter) = (upstream.to_string(), Arc::new(pick), lost.clone());
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let (upstream, pick, counter) = (upstream.clone(), pick.clone(), counter.clone());
            std::thread::spawn(move || {
                let _ = serve(client, &upstream, &*pick, &counter);
            });
        }
    });
    LossyProxy { url, lost }
}

/// Serves one request on `client` (the forwarded request asks the upstream to close, so its
/// answer ends at end of stream and needs no parsing).
fn serve(
    client: TcpStream,
    upstream: &str,
    pick: &dyn Fn(&str) -> bool,
    lost: &AtomicU32,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut head = Vec::new();
    let mut request_line = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let trimmed = line.trim_end();
        if request_line.is_empty() {
            request_line = trimmed.to_string();
        }
        if trimmed.is_empty() {
            break;
        }
        let lower = trimmed.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if !lower.starts_with("connection:") {
            head.extend_from_slice(line.as_bytes());
        }
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    let mut up = TcpStream::connect(upstream)?;
    up.write_all(&head)?;
    up.write_all(&body)?;
    let mut answer = Vec::new();
    up.read_to_end(&mut answer)?;
    let mut client = client;
    if pick(&request_line) {
        lost.fetch_add(1, Ordering::SeqCst);
        client.write_all(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )?;
    } else {
        client.write_all(&answer)?;
    }
    client.flush()
}
