//! The little HTTP/1.1 that `synaptix serve` speaks: one request per connection (the response
//! closes it), bodies sized by `Content-Length`, answers with a length or as a server-sent event
//! stream. Limits keep a hostile client from holding memory or the (single) worker: headers up to
//! 64 KiB, bodies up to 25 MiB (OpenAI's limit for audio uploads), and a read timeout.

use std::io::{self, Read, Write};

/// Largest request head (request line and headers).
const MAX_HEAD: usize = 64 << 10;
/// Largest request body.
const MAX_BODY: usize = 25 << 20;

#[derive(Debug)]
pub struct Request {
    pub method: String,
    /// The path without its query string.
    pub path: String,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

#[derive(Debug)]
pub enum HttpError {
    /// Malformed or unsupported request: answered with 400 (or the given status).
    Bad(u16, String),
    /// The connection failed or timed out: nothing can be answered.
    Io(io::Error),
}

impl From<io::Error> for HttpError {
    fn from(e: io::Error) -> Self {
        HttpError::Io(e)
    }
}

/// Reads one request from `conn`.
pub fn read_request(conn: &mut impl Read) -> Result<Request, HttpError> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = find(&buf, b"\r\n\r\n") {
            break at;
        }
        if buf.len() > MAX_HEAD {
            return Err(HttpError::Bad(431, "request head over 64 KiB".into()));
        }
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            return Err(HttpError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = std::str::from_utf8(&buf[..head_end])
        .map_err(|_| HttpError::Bad(400, "request head is not UTF-8".into()))?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::Bad(
            400,
            format!("bad request line {request_line:?}"),
        ));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError::Bad(
            505,
            format!("unsupported version {version}"),
        ));
    }
    let mut length = 0usize;
    let mut authorization = None;
    let mut content_type = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(HttpError::Bad(400, format!("bad header line {line:?}")));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("authorization") {
            authorization = Some(value.to_string());
        } else if name.eq_ignore_ascii_case("content-type") {
            content_type = Some(value.to_string());
        } else if name.eq_ignore_ascii_case("content-length") {
            length = value
                .parse()
                .map_err(|_| HttpError::Bad(400, format!("bad Content-Length {value:?}")))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && !value.eq_ignore_ascii_case("identity")
        {
            return Err(HttpError::Bad(
                411,
                "request bodies need a Content-Length (no chunked encoding)".into(),
            ));
        }
    }
    if length > MAX_BODY {
        return Err(HttpError::Bad(413, "request body over 25 MiB".into()));
    }
    let (method, path) = (
        method.to_string(),
        target.split('?').next().unwrap_or_default().to_string(),
    );
    let mut body = buf.split_off(head_end + 4);
    if body.len() > length {
        body.truncate(length);
    }
    while body.len() < length {
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            return Err(HttpError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
        let take = n.min(length - body.len());
        body.extend_from_slice(&chunk[..take]);
    }
    Ok(Request {
        method,
        path,
        authorization,
        content_type,
        body,
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// A complete response; the connection closes after it.
pub fn respond(
    conn: &mut impl Write,
    status: u16,
    content_type: &str,
    body: &[u8],
) -> io::Result<()> {
    write!(
        conn,
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Access-Control-Allow-Origin: *\r\nConnection: close\r\n\r\n",
        reason(status),
        body.len()
    )?;
    conn.write_all(body)?;
    conn.flush()
}

/// A server-sent event stream: [`EventStream::start`] writes the head, each
/// [`EventStream::send`] one `data:` event (flushed at once).
pub struct EventStream<'a, W: Write> {
    conn: &'a mut W,
}

impl<'a, W: Write> EventStream<'a, W> {
    pub fn start(conn: &'a mut W) -> io::Result<Self> {
        conn.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
              Access-Control-Allow-Origin: *\r\nConnection: close\r\n\r\n",
        )?;
        conn.flush()?;
        Ok(EventStream { conn })
    }

    pub fn send(&mut self, data: &str) -> io::Result<()> {
        write!(self.conn, "data: {data}\n\n")?;
        self.conn.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> Result<Request, HttpError> {
        read_request(&mut &raw[..])
    }

    #[test]
    fn reads_a_request_with_a_body_in_pieces() {
        let raw =
            b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\ncontent-length: 5\r\n\r\nhello";
        let r = parse(raw).unwrap();
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(r.body, b"hello");
        // A reader that hands out one byte at a time gives the same request.
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
                let Some((&b, rest)) = self.0.split_first() else {
                    return Ok(0);
                };
                out[0] = b;
                self.0 = rest;
                Ok(1)
            }
        }
        let r = read_request(&mut Trickle(raw)).unwrap();
        assert_eq!(r.body, b"hello");
    }

    #[test]
    fn refuses_bad_requests_with_a_status() {
        let status = |raw: &[u8]| match parse(raw) {
            Err(HttpError::Bad(s, _)) => s,
            other => panic!("{other:?}"),
        };
        assert_eq!(status(b"GARBAGE\r\n\r\n"), 400);
        assert_eq!(status(b"GET / SPDY/3\r\n\r\n"), 505);
        assert_eq!(status(b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n"), 400);
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            411
        );
        assert_eq!(
            status(b"POST / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n"),
            413
        );
        let mut huge = b"GET / HTTP/1.1\r\n".to_vec();
        huge.extend(std::iter::repeat_n(b'a', MAX_HEAD + 10));
        assert_eq!(status(&huge), 431);
        // A body shorter than its Content-Length is a broken connection, not a request.
        assert!(matches!(
            parse(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"),
            Err(HttpError::Io(_))
        ));
    }
}
