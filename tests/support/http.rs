//! A server on loopback and a minimal HTTP/1.1 client (plain `std::net::TcpStream`, so the
//! tests depend on no client library's view of HTTP), shared by the middleware tests
//! (tests/middleware/ and the `middleware` module of tests/redis/).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::Duration;

use axum::Router;

/// Serves `app` on 127.0.0.1:0 from a background thread with its own runtime of `workers`
/// threads, with `ConnectInfo<SocketAddr>` in every request. The server lives as long as the
/// test process.
pub fn serve_with(app: Router, workers: usize) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    thread::spawn(move || {
        let runtime = if workers == 1 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .enable_all()
                .build()
        }
        .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .unwrap();
        });
    });
    addr
}

pub fn serve(app: Router) -> SocketAddr {
    serve_with(app, 1)
}

/// A response as read off the wire.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// The value of header `name`, which must appear at most once.
    pub fn header(&self, name: &str) -> Option<&str> {
        let mut values = self
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str());
        let first = values.next();
        assert!(values.next().is_none(), "header {name} repeated: {self:?}");
        first
    }

    pub fn has(&self, name: &str) -> bool {
        self.header(name).is_some()
    }
}

/// Sends one request on a fresh connection and reads the whole response.
pub fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    read_reply(&mut reader, true)
}

pub fn get_path(addr: SocketAddr, path: &str) -> Reply {
    send(addr, "GET", path, &[])
}

/// Reads one response; with `to_end` the body runs to the end of the stream, otherwise it is
/// `Content-Length` bytes long.
pub fn read_reply(reader: &mut impl BufRead, to_end: bool) -> Reply {
    let mut line = String::new();
    reader.read_line(&mut line).expect("status line");
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).expect("header line");
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        let (name, value) = trimmed.split_once(':').expect("header syntax");
        headers.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    let mut body = Vec::new();
    let length = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse::<usize>().unwrap());
    match length {
        Some(length) => {
            body.resize(length, 0);
            reader.read_exact(&mut body).unwrap();
        }
        None if to_end => {
            reader.read_to_end(&mut body).unwrap();
        }
        None => panic!("keep-alive response without content-length"),
    }
    Reply {
        status,
        headers,
        body: String::from_utf8(body).unwrap(),
    }
}
