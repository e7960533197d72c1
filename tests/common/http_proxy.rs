//! An HTTP fault proxy for storage tests, in front of a local emulator (SeaweedFS, Azurite,
//! fake-gcs-server): it forwards each request unchanged (the `Host` header too, so SigV4 and
//! Shared Key signatures still match) and answers with the upstream's response, except for the
//! requests a rule picks, which get a fault instead: an error status, a reset connection, a
//! response cut after some bytes of its body, or a delay.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a rule does to a request it picks.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Not forwarded; answered with this status and body.
    Status(u16, String),
    /// Not forwarded; the connection is closed without an answer.
    Reset,
    /// Forwarded; the answer is cut after its head and this many bytes of its body.
    CutBody(usize),
    /// Forwarded after this long.
    Delay(Duration),
}

/// A rule: the requests it picks (by request line, e.g. `PUT /bucket/key?partNumber=2 HTTP/1.1`),
/// what it does, and how many more times.
struct Rule {
    pick: Box<dyn Fn(&str) -> bool + Send>,
    fault: Fault,
    left: u32,
}

#[derive(Default)]
struct State {
    rules: Vec<Rule>,
    /// Every request line seen, in order, and the fault it got.
    log: Vec<(String, Option<String>)>,
}

/// A running proxy.
pub struct HttpProxy {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    pub port: u16,
    state: Arc<Mutex<State>>,
}

impl HttpProxy {
    /// Starts a proxy to `upstream` (`127.0.0.1:8333`).
    pub fn start(upstream: &str) -> HttpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State::default()));
        let (upstream, st) = (upstream.to_string(), state.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (upstream, st) = (upstream.clone(), st.clone());
                std::thread::spawn(move || {
                    let _ = serve(client, &upstream, &st);
                });
            }
        });
        HttpProxy {
            url: format!("http://127.0.0.1:{port}"),
            port,
            state,
        }
    }

    /// Adds a rule: the next `times` requests whose request line `pick` says true of get
    /// `fault`. Rules are tried in the order they were added.
    pub fn inject(&self, times: u32, fault: Fault, pick: impl Fn(&str) -> bool + Send + 'static) {
        self.state.lock().unwrap().rules.push(Rule {
            pick: Box::new(pick),
            fault,
            left: times,
        });
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.state.lock().unwrap().rules.clear();
    }

    /// The request lines seen so far and the fault each got (`None`: forwarded unchanged).
    pub fn log(&self) -> Vec<(String, Option<String>)> {
        self.state.lock().unwrap().log.clone()
    }

    /// How many requests got a fault.
    pub fn faults(&self) -> usize {
        self.log().iter().filter(|(_, f)| f.is_some()).count()
    }
}

/// Reads one request (head, then its body by Content-Length or chunked) from `r`.
fn read_request(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut head = Vec::new();
    let mut line0 = String::new();
    let mut length = 0usize;
    let mut chunked = false;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let t = line.trim_end().to_string();
        if line0.is_empty() {
            line0 = t.clone();
        }
        let lower = t.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
        // The upstream closes after answering: its answer then ends at end of stream.
        if !lower.starts_with("connection:") && !lower.is_empty() {
            head.extend_from_slice(line.trim_end().as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        if t.is_empty() {
            break;
        }
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            body.extend_from_slice(size.as_bytes());
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .unwrap_or(0);
            let mut chunk = vec![0u8; n + 2];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk);
            if n == 0 {
                break;
            }
        }
    } else {
        body.resize(length, 0);
        r.read_exact(&mut body)?;
    }
    let mut req = head;
    req.extend_from_slice(&body);
    Ok(Some((line0, req)))
}

fn serve(client: TcpStream, upstream: &str, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut out = client;
    while let Some((line, request)) = read_request(&mut reader)? {
        let fault = {
            let mut st = state.lock().unwrap();
            let fault = st
                .rules
                .iter_mut()
                .find(|r| r.left > 0 && (r.pick)(&line))
                .map(|r| {
                    r.left -= 1;
                    r.fault.clone()
                });
            st.log
                .push((line.clone(), fault.as_ref().map(|f| format!("{f:?}"))));
            fault
        };
        match fault {
            Some(Fault::Status(code, body)) => {
                let answer = format!(
                    "HTTP/1.1 {code} Fault\r\nContent-Length: {}\r\nContent-Type: application/xml\r\n\r\n{body}",
                    body.len()
                );
                out.write_all(answer.as_bytes())?;
                continue;
            }
            Some(Fault::Reset) => {
                let _ = out.shutdown(Shutdown::Both);
                return Ok(());
            }
            Some(Fault::Delay(d)) => std::thread::sleep(d),
            _ => {}
        }
        let mut up = TcpStream::connect(upstream)?;
        up.write_all(&request)?;
        let mut answer = Vec::new();
        up.read_to_end(&mut answer)?;
        if let Some(Fault::CutBody(n)) = fault {
            let head_end = answer
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map_or(answer.len(), |p| p + 4);
            let cut = (head_end + n).min(answer.len());
            out.write_all(&answer[..cut])?;
            let _ = out.shutdown(Shutdown::Both);
            return Ok(());
        }
        // One answer per connection: the upstream closed, and so does the proxy.
        out.write_all(&answer)?;
        let _ = out.shutdown(Shutdown::Write);
        return Ok(());
    }
    Ok(())
}
