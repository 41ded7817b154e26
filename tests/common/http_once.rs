//! One HTTP/1.1 exchange on a socket, for the tests' model servers on 127.0.0.1: read the
//! request (line, headers, body by `content-length`), answer JSON with a status, close.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A request as a test server read it.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    /// The request line, e.g. `POST /v1/chat/completions HTTP/1.1`.
    pub line: String,
    /// Header names (lower-cased) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body, `content-length` bytes of it.
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// The value of header `name` (lower-case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one request off `stream` (10 s read timeout), answers it with the status and JSON
/// text that `reply` makes of it, closes the connection and returns the request; `None` when
/// the exchange broke off.
pub fn answer_once(
    stream: TcpStream,
    reply: impl FnOnce(&HttpRequest) -> (u16, String),
) -> Option<HttpRequest> {
    stream.set_nonblocking(false).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut headers = Vec::new();
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim().to_string());
        if name == "content-length" {
            length = value.parse().ok()?;
        }
        headers.push((name, value));
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    let request = HttpRequest {
        line: line.trim_end().to_string(),
        headers,
        body,
    };
    let (status, text) = reply(&request);
    let response = format!(
        "HTTP/1.1 {status} Test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
        text.len()
    );
    let mut stream = reader.into_inner();
    stream.write_all(response.as_bytes()).ok()?;
    stream.flush().ok()?;
    Some(request)
}

/// A one-thread HTTP/1.1 server on 127.0.0.1 answering every request with 200 and `body`
/// as text, counting the requests it got (a page of a machine's own network, for
/// `web_fetch`'s tests). Its thread ends with the test process.
pub struct LocalPage {
    /// Its port on 127.0.0.1.
    pub port: u16,
    hits: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl LocalPage {
    /// Serves `body` on a free port of 127.0.0.1.
    pub fn start(body: &'static str) -> LocalPage {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = std::sync::Arc::new(AtomicUsize::new(0));
        let seen = hits.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                seen.fetch_add(1, Ordering::SeqCst);
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes());
            }
        });
        LocalPage { port, hits }
    }

    /// The requests it got so far.
    pub fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }
}
