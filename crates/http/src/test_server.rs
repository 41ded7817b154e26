//! A tiny HTTP/1.1 server on 127.0.0.1 answering canned responses, for the tests of this
//! crate and of the web tools (the test machine has no other network). Built only for tests
//! (here) or with the `test-server` feature (td-tools' dev-dependency).

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A canned answer: status line, headers, body, and how many times to repeat the body.
#[derive(Clone, Debug)]
pub struct Canned {
    /// The status line after `HTTP/1.1 `, e.g. `200 OK`.
    pub status: &'static str,
    /// Headers besides `Content-Length` and `Connection`.
    pub headers: Vec<(String, String)>,
    /// The body, sent `repeat` times.
    pub body: Vec<u8>,
    /// How many times the body is sent.
    pub repeat: usize,
    /// The `Content-Length` announced when it is not the body's (a server that breaks off
    /// in the middle of its reply).
    pub announced_length: Option<usize>,
}

impl Canned {
    /// An answer with a `Content-Type` header, sent once.
    pub fn new(status: &'static str, content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: body.into(),
            repeat: 1,
            announced_length: None,
        }
    }
}

/// The running server: its base URL and the request heads it saw.
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The head of every request received, in order.
    pub requests: Arc<Mutex<Vec<String>>>,
}

/// Starts a server whose `route` maps a request path (with query) to an answer.
pub async fn start(route: impl Fn(&str) -> Canned + Send + Sync + 'static) -> Server {
    let route = Arc::new(route);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            let route = route.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                seen.lock().unwrap().push(head);
                let c = route(&path);
                let len = c.announced_length.unwrap_or(c.body.len() * c.repeat);
                let mut out = format!(
                    "HTTP/1.1 {}\r\nContent-Length: {len}\r\nConnection: close\r\n",
                    c.status
                );
                for (k, v) in &c.headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str("\r\n");
                if sock.write_all(out.as_bytes()).await.is_err() {
                    return;
                }
                for _ in 0..c.repeat {
                    // The client may hang up once it has enough; that is expected.
                    if sock.write_all(&c.body).await.is_err() {
                        return;
                    }
                }
                let _ = sock.shutdown().await;
            });
        }
    });
    Server {
        base: format!("http://{addr}"),
        requests,
    }
}
