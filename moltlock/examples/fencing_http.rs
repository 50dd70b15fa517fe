//! Fences checked by services over HTTP (docs/FENCING.md, sections 2 and 3),
//! on loopback:
//!
//! - `PUT /fenced/<key>` with a `Fence-Token` header: a service that keeps
//!   the highest fence per lock key and answers `409 Conflict` to an older
//!   one;
//! - `GET` and `PUT /objects/<name>`: an object store's conditional writes
//!   (`ETag`, `If-Match`, `If-None-Match: *`, `412 Precondition Failed`),
//!   with the writer's fence in the object's metadata (`X-Fence`), as S3,
//!   GCS and Azure Blob offer them. The writer follows the guide's steps:
//!   read the version and the fence, stop if a later fence wrote, write
//!   only if the version is unchanged, else read again.
//!
//! Worker A reads the object, then pauses while its lock ends; worker B
//! takes the lock and writes; A's late writes are refused by both.
//!
//! ```sh
//! cargo run -p moltlock --example fencing_http     # locks in an SQLite file
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lock every writer of the report takes.
const KEY: &str = "reports/nightly";

/// An object: its version (the ETag), the fence stored with it, its body.
#[derive(Clone)]
struct Object {
    version: u64,
    fence: u64,
    body: String,
}

/// What the services keep.
#[derive(Default)]
struct State {
    /// Per lock key, the highest fence accepted (`/fenced`).
    highest: HashMap<String, u64>,
    /// The fenced service's stored bodies.
    fenced: HashMap<String, String>,
    /// The object store (`/objects`).
    objects: HashMap<String, Object>,
}

/// A request, as far as these services read it.
struct Request {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: String,
}

/// A reply: status, headers, body.
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
}

impl Reply {
    fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: String::new(),
        }
    }
}

/// One request under the state's mutex: each check and its write are one
/// step, so no other request lands between them.
fn handle(state: &Mutex<State>, req: &Request) -> Reply {
    let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(key) = req.path.strip_prefix("/fenced/") {
        return put_fenced(&mut state, key, req);
    }
    let Some(name) = req.path.strip_prefix("/objects/") else {
        return Reply::status(404);
    };
    match req.method.as_str() {
        "GET" => get_object(&state, name),
        "PUT" => put_object(&mut state, name, req),
        _ => Reply::status(405),
    }
}

/// `PUT /fenced/<key>`: refuses a fence older than the key's highest.
fn put_fenced(state: &mut State, key: &str, req: &Request) -> Reply {
    let Some(fence) = number(req.headers.get("fence-token")) else {
        return Reply::status(400);
    };
    let seen = state.highest.entry(key.to_owned()).or_insert(0);
    if fence < *seen {
        return Reply::status(409);
    }
    *seen = fence;
    state.fenced.insert(key.to_owned(), req.body.clone());
    Reply::status(204)
}

fn get_object(state: &State, name: &str) -> Reply {
    match state.objects.get(name) {
        None => Reply::status(404),
        Some(o) => Reply {
            status: 200,
            headers: vec![
                ("ETag", format!("\"{}\"", o.version)),
                ("X-Fence", o.fence.to_string()),
            ],
            body: o.body.clone(),
        },
    }
}

/// `PUT /objects/<name>`: a conditional write on the object's version.
fn put_object(state: &mut State, name: &str, req: &Request) -> Reply {
    let Some(fence) = number(req.headers.get("x-fence")) else {
        return Reply::status(400);
    };
    let current = state.objects.get(name).map(|o| o.version);
    let allowed = match (
        req.headers.get("if-match"),
        req.headers.get("if-none-match"),
    ) {
        (Some(tag), _) => current.is_some_and(|v| *tag == format!("\"{v}\"")),
        (None, Some(star)) => star == "*" && current.is_none(),
        (None, None) => false, // the writer must say which version it read
    };
    if !allowed {
        return Reply::status(412);
    }
    let version = current.unwrap_or(0) + 1;
    let body = req.body.clone();
    state.objects.insert(
        name.to_owned(),
        Object {
            version,
            fence,
            body,
        },
    );
    Reply {
        status: 200,
        headers: vec![("ETag", format!("\"{version}\""))],
        body: String::new(),
    }
}

fn number(text: Option<&String>) -> Option<u64> {
    text.and_then(|t| t.trim().parse().ok())
}

/// Serves one connection: one request, then close.
async fn serve(stream: TcpStream, state: Arc<Mutex<State>>) -> Result<(), BoxError> {
    let mut reader = BufReader::new(stream);
    let req = read_request(&mut reader).await?;
    let reply = handle(&state, &req);
    let mut text = format!("HTTP/1.1 {} \r\n", reply.status);
    for (name, value) in &reply.headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{}",
        reply.body.len(),
        reply.body
    ));
    reader.get_mut().write_all(text.as_bytes()).await?;
    Ok(())
}

/// Reads a request line, headers (names lower-cased) and a
/// `Content-Length` body.
async fn read_request(reader: &mut BufReader<TcpStream>) -> Result<Request, BoxError> {
    let (start, headers) = read_head(reader).await?;
    let mut parts = start.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let body = read_body(reader, &headers).await?;
    Ok(Request {
        method,
        path,
        headers,
        body,
    })
}

/// The first line and the headers of a request or a reply.
async fn read_head(
    reader: &mut BufReader<TcpStream>,
) -> Result<(String, HashMap<String, String>), BoxError> {
    let mut start = String::new();
    reader.read_line(&mut start).await?;
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
    }
    Ok((start, headers))
}

async fn read_body(
    reader: &mut BufReader<TcpStream>,
    headers: &HashMap<String, String>,
) -> Result<String, BoxError> {
    let len = number(headers.get("content-length")).unwrap_or(0);
    let mut body = vec![0; usize::try_from(len)?];
    reader.read_exact(&mut body).await?;
    Ok(String::from_utf8(body)?)
}

/// A client's request; returns the status, the reply's headers and body.
async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &str,
) -> Result<(u16, HashMap<String, String>, String), BoxError> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut text = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(text.as_bytes()).await?;
    let mut reader = BufReader::new(stream);
    let (status_line, reply_headers) = read_head(&mut reader).await?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("a reply without a status")?;
    let body = read_body(&mut reader, &reply_headers).await?;
    Ok((status, reply_headers, body))
}

/// What an object read found: its ETag and fence, if it exists.
type Seen = Option<(String, u64)>;

async fn read_object(addr: SocketAddr, name: &str) -> Result<Seen, BoxError> {
    let (status, headers, _) = call(addr, "GET", &format!("/objects/{name}"), &[], "").await?;
    match status {
        404 => Ok(None),
        200 => {
            let tag = headers.get("etag").cloned().ok_or("no ETag")?;
            let fence = number(headers.get("x-fence")).ok_or("no X-Fence")?;
            Ok(Some((tag, fence)))
        }
        other => Err(format!("GET answered {other}").into()),
    }
}

/// Writes the object as a holder of `fence` that last read `seen`: `Ok(true)`
/// once written, `Ok(false)` when a later fence wrote (the write is stale).
async fn write_object(
    addr: SocketAddr,
    name: &str,
    fence: u64,
    mut seen: Seen,
    body: &str,
) -> Result<bool, BoxError> {
    loop {
        if seen.as_ref().is_some_and(|(_, stored)| *stored > fence) {
            return Ok(false); // step 2: a later holder wrote
        }
        let condition = match &seen {
            Some((tag, _)) => ("If-Match", tag.clone()),
            None => ("If-None-Match", "*".to_owned()),
        };
        let headers = [condition, ("X-Fence", fence.to_string())];
        let path = format!("/objects/{name}");
        match call(addr, "PUT", &path, &headers, body).await?.0 {
            200 => return Ok(true),
            412 => seen = read_object(addr, name).await?, // changed since: read again
            other => return Err(format!("PUT answered {other}").into()),
        }
    }
}

async fn send_fenced(addr: SocketAddr, fence: u64, body: &str) -> Result<u16, BoxError> {
    let headers = [("Fence-Token", fence.to_string())];
    Ok(call(addr, "PUT", &format!("/fenced/{KEY}"), &headers, body)
        .await?
        .0)
}

/// Starts the services on a loopback port of the system's choosing.
async fn start() -> Result<SocketAddr, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(Mutex::new(State::default()));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let state = state.clone();
            tokio::spawn(async move {
                if let Err(e) = serve(stream, state).await {
                    eprintln!("a request failed: {e}");
                }
            });
        }
    });
    Ok(addr)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let url = std::env::var("MOLTLOCK_URL")
        .unwrap_or_else(|_| format!("sqlite://{}", dir.path().join("locks.db").display()));
    let manager = moltlock::manager(&url).await?;
    let addr = start().await?;

    // A reads the object while it holds the lock, then pauses; its lock
    // ends meanwhile (released here; in life it expires).
    let a = manager.lock(KEY).await?;
    let fence_a = a.fence().get();
    let a_read = read_object(addr, "report").await?;
    a.release().await?;

    // B takes the lock (a later fence) and writes to both services.
    let b = manager.lock(KEY).await?;
    let fence_b = b.fence().get();
    let b_put = send_fenced(addr, fence_b, "B's report").await?;
    let b_read = read_object(addr, "report").await?;
    let b_wrote = write_object(addr, "report", fence_b, b_read, "B's report").await?;
    b.release().await?;

    // A's late writes: the service answers 409; the object's version
    // changed since A read it (412), and the fence read again is B's.
    let a_put = send_fenced(addr, fence_a, "A's stale report").await?;
    let a_wrote = write_object(addr, "report", fence_a, a_read, "A's stale report").await?;
    let (_, _, body) = call(addr, "GET", "/objects/report", &[], "").await?;
    println!("A had fence {fence_a}, B has fence {fence_b}");
    println!("fenced service: B answered {b_put}, A answered {a_put}");
    println!("object store: B wrote {b_wrote}, A wrote {a_wrote}; the object reads {body:?}");
    if !(b_put == 204 && a_put == 409 && b_wrote && !a_wrote && body == "B's report") {
        return Err("a stale write was not refused".into());
    }
    Ok(())
}
