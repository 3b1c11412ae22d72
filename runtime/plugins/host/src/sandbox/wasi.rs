//! A locked-down WASI for the few WASI interfaces Rust's std links into a `wasm32-wasip2` component even when the
//! plugin never does I/O (the panic message path, environment lookups, `HashMap` seeds, `Instant`): no
//! filesystem, no sockets, no environment variables or arguments, no stdin (always at its end); stdout and stderr go
//! to the plugin's rate-limited log one line at a time (stdout at INFO, stderr at WARN, so a panic message is
//! seen); clocks work; random numbers come from the OS CSPRNG (one request is capped at
//! [`MAX_RANDOM_BYTES`], more traps: `get-random-bytes` has no error case); `exit` traps. Every other WASI
//! interface (filesystem, sockets, http...) is refused at load time, so a plugin that needs one is rejected with
//! the list of what it imports.
//!
//! No WASI WIT files and no wasmtime-wasi: the functions whose arguments or results carry bytes (stream writes,
//! random bytes) are typed host functions (`list<u8>` read in place from guest memory or returned as one
//! `Vec<u8>`, never a `Val` per byte), checked against the component's import types when the plugin is linked;
//! the rest are defined dynamically from the component's own import types and return a neutral value of their
//! result type (empty list, none, ok, zero, a fresh inert resource handle), except where the neutral value would
//! make a guest wait forever (a pollable is always ready, `poll` reports every pollable ready, reading stdin
//! reports its end).

use rand::TryRngCore;
use rand::rngs::OsRng;
use wasmtime::component::types::{ComponentItem, Type};
use wasmtime::component::{
    ComponentType, Lift, Linker, LinkerInstance, Lower, Resource, ResourceType, Val, WasmList,
};
use wasmtime::{Engine, StoreContextMut};

use crate::sandbox::store::StoreData;
use crate::wit::bindings::policy::weft::plugin::log::Level;

/// The host type behind every WASI resource (streams, pollables, errors, terminals): inert handles.
pub(crate) struct WasiStub;

/// Most bytes one `get-random-bytes` (or `get-insecure-random-bytes`) call may ask for; a larger request traps.
pub(crate) const MAX_RANDOM_BYTES: u64 = 64 << 10;
/// What `check-write` permits, and the most one `write` may carry (more traps, as WASI specifies).
const WRITE_BUDGET: u64 = 64 << 10;
/// The most one `blocking-write-and-flush` may carry (WASI's figure; more traps).
const BLOCKING_WRITE_MAX: u32 = 4096;
/// Handle numbers of the stdout and stderr streams (other inert handles count up from 1).
const STDOUT_REP: u32 = u32::MAX;
const STDERR_REP: u32 = u32::MAX - 1;

const ALLOWED: &[&str] = &[
    "wasi:io/poll",
    "wasi:io/error",
    "wasi:io/streams",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
];

/// `wasi:io/streams.stream-error`. weft's streams never fail, but the typed functions need the type.
#[derive(ComponentType, Lift, Lower)]
#[component(variant)]
enum StreamError {
    #[component(name = "last-operation-failed")]
    LastOperationFailed(Resource<WasiStub>),
    #[component(name = "closed")]
    Closed,
}

/// Defines the locked-down WASI for whatever WASI the component imports. Returns the imports it refuses.
pub(crate) fn define(
    engine: &Engine,
    component: &wasmtime::component::Component,
    linker: &mut Linker<StoreData>,
) -> Result<(), String> {
    let ty = component.component_type();
    let mut refused = Vec::new();
    for (name, item) in ty.imports(engine) {
        if !name.starts_with("wasi:") {
            continue;
        }
        let base = name.split('@').next().unwrap_or(name);
        if !ALLOWED.contains(&base) {
            refused.push(name.to_string());
            continue;
        }
        let ComponentItem::ComponentInstance(inst_ty) = item.ty else {
            refused.push(name.to_string());
            continue;
        };
        let mut inst = linker.instance(name).map_err(|e| format!("{e:#}"))?;
        for (export, item) in inst_ty.exports(engine) {
            let r = match item.ty {
                ComponentItem::Resource(_) => {
                    inst.resource(export, ResourceType::host::<WasiStub>(), |_, _| Ok(()))
                }
                ComponentItem::ComponentFunc(_) => {
                    if define_typed(&mut inst, base, export)? {
                        Ok(())
                    } else {
                        let iface = base.to_string();
                        let func = export.to_string();
                        inst.func_new(export, move |store, fty, params, results| {
                            call(store, &iface, &func, fty.results(), params, results)
                        })
                    }
                }
                _ => Ok(()),
            };
            r.map_err(|e| format!("{name}#{export}: {e:#}"))?;
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the component imports {}, which weft does not offer (plugins get no filesystem, network or \
             environment)",
            refused.join(", ")
        ))
    }
}

/// Defines `func` of `iface` as a typed host function if it is one that carries bytes or names a stream.
/// `Ok(false)`: not one of those (define it dynamically).
fn define_typed(
    inst: &mut LinkerInstance<'_, StoreData>,
    iface: &str,
    func: &str,
) -> Result<bool, String> {
    let r = match (iface, func) {
        ("wasi:cli/stdout", "get-stdout") => inst.func_wrap(func, |_, (): ()| {
            Ok((Resource::<WasiStub>::new_own(STDOUT_REP),))
        }),
        ("wasi:cli/stderr", "get-stderr") => inst.func_wrap(func, |_, (): ()| {
            Ok((Resource::<WasiStub>::new_own(STDERR_REP),))
        }),
        // Handles to inert resources (pollables that are always ready, stdin at its end).
        (
            "wasi:io/streams",
            "[method]output-stream.subscribe" | "[method]input-stream.subscribe",
        ) => inst.func_wrap(func, |mut store, (_stream,): (Resource<WasiStub>,)| {
            Ok((fresh_handle(&mut store),))
        }),
        ("wasi:clocks/monotonic-clock", "subscribe-instant" | "subscribe-duration") => inst
            .func_wrap(func, |mut store, (_when,): (u64,)| {
                Ok((fresh_handle(&mut store),))
            }),
        ("wasi:cli/stdin", "get-stdin") => {
            inst.func_wrap(func, |mut store, (): ()| Ok((fresh_handle(&mut store),)))
        }
        ("wasi:io/streams", "[method]output-stream.check-write") => inst
            .func_wrap(func, |_, (_stream,): (Resource<WasiStub>,)| {
                Ok((Ok::<u64, StreamError>(WRITE_BUDGET),))
            }),
        ("wasi:io/streams", "[method]output-stream.write") => inst.func_wrap(
            func,
            |store, (stream, bytes): (Resource<WasiStub>, WasmList<u8>)| {
                write(store, &stream, &bytes, WRITE_BUDGET as usize, false)
            },
        ),
        ("wasi:io/streams", "[method]output-stream.blocking-write-and-flush") => inst.func_wrap(
            func,
            |store, (stream, bytes): (Resource<WasiStub>, WasmList<u8>)| {
                write(store, &stream, &bytes, BLOCKING_WRITE_MAX as usize, true)
            },
        ),
        (
            "wasi:io/streams",
            "[method]output-stream.flush" | "[method]output-stream.blocking-flush",
        ) => inst.func_wrap(func, |mut store, (stream,): (Resource<WasiStub>,)| {
            flush(store.data_mut(), stream.rep());
            Ok((Ok::<(), StreamError>(()),))
        }),
        ("wasi:random/random", "get-random-bytes")
        | ("wasi:random/insecure", "get-insecure-random-bytes") => {
            let name = func.to_string();
            inst.func_wrap(func, move |_, (len,): (u64,)| {
                Ok((random_bytes(&name, len)?,))
            })
        }
        ("wasi:random/random", "get-random-u64")
        | ("wasi:random/insecure", "get-insecure-random-u64") => {
            inst.func_wrap(func, |_, (): ()| Ok((random_u64()?,)))
        }
        ("wasi:random/insecure-seed", "insecure-seed") => {
            inst.func_wrap(func, |_, (): ()| Ok(((random_u64()?, random_u64()?),)))
        }
        _ => return Ok(false),
    };
    r.map(|()| true)
        .map_err(|e| format!("wasi {iface}#{func}: {e:#}"))
}

/// A new owned handle to an inert resource.
fn fresh_handle(store: &mut StoreContextMut<'_, StoreData>) -> Resource<WasiStub> {
    Resource::new_own(store.data_mut().next_stub_rep())
}

/// `len` bytes from the OS CSPRNG; over [`MAX_RANDOM_BYTES`] traps before anything is allocated.
pub(crate) fn random_bytes(func: &str, len: u64) -> wasmtime::Result<Vec<u8>> {
    if len > MAX_RANDOM_BYTES {
        return Err(wasmtime::format_err!(
            "wasi:random {func}({len}): more than the {MAX_RANDOM_BYTES} bytes weft hands out per call"
        ));
    }
    let mut buf = vec![0u8; len as usize];
    OsRng
        .try_fill_bytes(&mut buf)
        .map_err(|e| wasmtime::format_err!("the OS random number generator failed: {e}"))?;
    Ok(buf)
}

fn random_u64() -> wasmtime::Result<u64> {
    OsRng
        .try_next_u64()
        .map_err(|e| wasmtime::format_err!("the OS random number generator failed: {e}"))
}

/// A write to stdout or stderr (any other stream swallows the bytes): complete lines go to the log, the rest
/// waits for its newline (or a flush). More than `max` bytes in one write traps, as WASI specifies.
fn write(
    mut store: StoreContextMut<'_, StoreData>,
    stream: &Resource<WasiStub>,
    bytes: &WasmList<u8>,
    max: usize,
    flush_after: bool,
) -> wasmtime::Result<(Result<(), StreamError>,)> {
    if bytes.len() > max {
        return Err(wasmtime::format_err!(
            "wasi:io/streams: a write of {} bytes, more than the {max} permitted",
            bytes.len()
        ));
    }
    let rep = stream.rep();
    if rep != STDOUT_REP && rep != STDERR_REP {
        return Ok((Ok(()),));
    }
    // At most `max` bytes: copy them out of guest memory so the log can borrow the store's data.
    let chunk = bytes.as_le_slice(&store).to_vec();
    let data = store.data_mut();
    let max_line = data.ctx.max_log_len;
    let mut pending = std::mem::take(buffer(data, rep));
    for piece in chunk.split_inclusive(|b| *b == b'\n') {
        if piece.ends_with(b"\n") {
            pending.extend_from_slice(piece);
            emit(data, rep, &pending);
            pending.clear();
        } else {
            // An unfinished line: keep at most a log line's worth (the log truncates anyway).
            let room = (max_line + 1).saturating_sub(pending.len());
            pending.extend_from_slice(&piece[..piece.len().min(room)]);
        }
    }
    *buffer(data, rep) = pending;
    if flush_after {
        flush(data, rep);
    }
    Ok((Ok(()),))
}

fn buffer(data: &mut StoreData, rep: u32) -> &mut Vec<u8> {
    if rep == STDERR_REP {
        &mut data.wasi.stderr
    } else {
        &mut data.wasi.stdout
    }
}

/// Logs the unfinished line of a stream, if any.
fn flush(data: &mut StoreData, rep: u32) {
    if rep != STDOUT_REP && rep != STDERR_REP {
        return;
    }
    let pending = std::mem::take(buffer(data, rep));
    if !pending.is_empty() {
        emit(data, rep, &pending);
    }
}

fn emit(data: &StoreData, rep: u32, line: &[u8]) {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches(['\n', '\r']);
    if text.trim().is_empty() {
        return;
    }
    let level = if rep == STDERR_REP {
        Level::Warn
    } else {
        Level::Info
    };
    data.log_line(level, text);
}

fn call(
    store: StoreContextMut<'_, StoreData>,
    iface: &str,
    func: &str,
    result_types: impl Iterator<Item = Type>,
    params: &[Val],
    results: &mut [Val],
) -> wasmtime::Result<()> {
    let special = match (iface, func) {
        ("wasi:cli/exit", _) => {
            return Err(wasmtime::format_err!(
                "plugin called wasi:cli/exit ({func})"
            ));
        }
        // A pollable is always ready: nothing weft offers ever waits.
        ("wasi:io/poll", "[method]pollable.ready") => Some(Val::Bool(true)),
        ("wasi:io/poll", "poll") => match params.first() {
            Some(Val::List(pollables)) => Some(Val::List(
                (0..pollables.len() as u32).map(Val::U32).collect(),
            )),
            _ => None,
        },
        // stdin is empty: every read reports its end.
        (
            "wasi:io/streams",
            "[method]input-stream.read"
            | "[method]input-stream.blocking-read"
            | "[method]input-stream.skip"
            | "[method]input-stream.blocking-skip",
        ) => Some(Val::Result(Err(Some(Box::new(Val::Variant(
            "closed".to_string(),
            None,
        )))))),
        ("wasi:clocks/monotonic-clock", "now") => Some(Val::U64(
            store.data().ctx.epoch_start.elapsed().as_nanos() as u64,
        )),
        ("wasi:clocks/wall-clock", "now") => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            Some(Val::Record(vec![
                ("seconds".to_string(), Val::U64(now.as_secs())),
                ("nanoseconds".to_string(), Val::U32(now.subsec_nanos())),
            ]))
        }
        _ => None,
    };
    let types: Vec<Type> = result_types.collect();
    for (slot, ty) in results.iter_mut().zip(&types) {
        *slot = match special.clone() {
            Some(v) => v,
            None => neutral(ty)?,
        };
    }
    Ok(())
}

/// A neutral value of a type: zero, empty, none, ok(neutral), the first case. Functions that hand out a resource
/// are typed (see `define_typed`): a handle made as a dynamic `Val` (`try_into_resource_any`) trapped when
/// `output-stream.subscribe` returned it, which made every `println!` fail.
fn neutral(ty: &Type) -> wasmtime::Result<Val> {
    Ok(match ty {
        Type::Bool => Val::Bool(false),
        Type::S8 => Val::S8(0),
        Type::U8 => Val::U8(0),
        Type::S16 => Val::S16(0),
        Type::U16 => Val::U16(0),
        Type::S32 => Val::S32(0),
        Type::U32 => Val::U32(0),
        Type::S64 => Val::S64(0),
        Type::U64 => Val::U64(0),
        Type::Float32 => Val::Float32(0.0),
        Type::Float64 => Val::Float64(0.0),
        Type::Char => Val::Char('\0'),
        Type::String => Val::String(String::new()),
        Type::List(_) => Val::List(Vec::new()),
        Type::Map(_) => Val::Map(Vec::new()),
        Type::Record(r) => Val::Record(
            r.fields()
                .map(|f| Ok((f.name.to_string(), neutral(&f.ty)?)))
                .collect::<wasmtime::Result<_>>()?,
        ),
        Type::Tuple(t) => Val::Tuple(
            t.types()
                .map(|t| neutral(&t))
                .collect::<wasmtime::Result<_>>()?,
        ),
        Type::Variant(v) => {
            let Some(case) = v.cases().next() else {
                return Err(wasmtime::format_err!("empty variant"));
            };
            let payload = match &case.ty {
                Some(t) => Some(Box::new(neutral(t)?)),
                None => None,
            };
            Val::Variant(case.name.to_string(), payload)
        }
        Type::Enum(e) => Val::Enum(e.names().next().unwrap_or_default().to_string()),
        Type::Option(_) => Val::Option(None),
        Type::Result(r) => Val::Result(Ok(match r.ok() {
            Some(t) => Some(Box::new(neutral(&t)?)),
            None => None,
        })),
        Type::Flags(_) => Val::Flags(Vec::new()),
        other => {
            return Err(wasmtime::format_err!(
                "WASI stub cannot produce a {other:?}"
            ));
        }
    })
}
