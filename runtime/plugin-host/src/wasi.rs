//! A locked-down WASI for the few WASI interfaces Rust's std links into a `wasm32-wasip2` component even when the
//! plugin never does I/O (the panic message path, environment lookups, `HashMap` seeds, `Instant`): no
//! filesystem, no sockets, no environment variables or arguments, no stdin; stdout and stderr go to the plugin's
//! rate-limited log; clocks and random numbers work; `exit` traps. Every other WASI interface (filesystem, sockets,
//! http...) is refused at load time, so a plugin that needs one is rejected with the list of what it imports.
//!
//! Functions are defined dynamically from the component's own import types (no WASI WIT files, no wasmtime-wasi):
//! the few that matter behave as above, the rest return a neutral value of their result type (empty list, none,
//! ok, zero, a fresh inert resource handle).

use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::component::types::{ComponentItem, Type};
use wasmtime::component::{Component, Linker, Resource, ResourceType, Val};
use wasmtime::{Engine, StoreContextMut};

use crate::store::StoreData;

/// The host type behind every WASI resource (streams, pollables, errors, terminals): inert handles.
pub(crate) struct WasiStub;

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

/// Defines the locked-down WASI for whatever WASI the component imports. Returns the imports it refuses.
pub(crate) fn define(
    engine: &Engine,
    component: &Component,
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
                    let iface = base.to_string();
                    let func = export.to_string();
                    inst.func_new(export, move |store, fty, params, results| {
                        call(store, &iface, &func, fty.results(), params, results)
                    })
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

fn random_u64() -> u64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    let mut x = STATE.load(Ordering::Relaxed);
    if x == 0 {
        x = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9E37_79B9_7F4A_7C15, |d| d.as_nanos() as u64)
            | 1;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    STATE.store(x, Ordering::Relaxed);
    x
}

fn call(
    mut store: StoreContextMut<'_, StoreData>,
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
        (
            "wasi:io/streams",
            "[method]output-stream.write" | "[method]output-stream.blocking-write-and-flush",
        ) => {
            if let Some(Val::List(bytes)) = params.get(1) {
                let bytes: Vec<u8> = bytes
                    .iter()
                    .map(|b| if let Val::U8(b) = b { *b } else { b'?' })
                    .collect();
                store.data().guest_print(&bytes);
            }
            None
        }
        ("wasi:io/streams", "[method]output-stream.check-write") => {
            Some(Val::Result(Ok(Some(Box::new(Val::U64(64 << 10))))))
        }
        ("wasi:random/insecure-seed", _) => Some(Val::Tuple(vec![
            Val::U64(random_u64()),
            Val::U64(random_u64()),
        ])),
        ("wasi:random/random" | "wasi:random/insecure", f) if f.ends_with("-u64") => {
            Some(Val::U64(random_u64()))
        }
        ("wasi:random/random" | "wasi:random/insecure", _) => {
            let len = match params.first() {
                Some(Val::U64(n)) => (*n).min(1 << 20) as usize,
                _ => 0,
            };
            Some(Val::List(
                (0..len).map(|_| Val::U8(random_u64() as u8)).collect(),
            ))
        }
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
            None => neutral(&mut store, ty)?,
        };
    }
    Ok(())
}

/// A neutral value of a type: zero, empty, none, ok(neutral), the first case, a fresh inert handle.
fn neutral(store: &mut StoreContextMut<'_, StoreData>, ty: &Type) -> wasmtime::Result<Val> {
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
                .map(|f| Ok((f.name.to_string(), neutral(store, &f.ty)?)))
                .collect::<wasmtime::Result<_>>()?,
        ),
        Type::Tuple(t) => Val::Tuple(
            t.types()
                .map(|t| neutral(store, &t))
                .collect::<wasmtime::Result<_>>()?,
        ),
        Type::Variant(v) => {
            let Some(case) = v.cases().next() else {
                return Err(wasmtime::format_err!("empty variant"));
            };
            let payload = match &case.ty {
                Some(t) => Some(Box::new(neutral(store, t)?)),
                None => None,
            };
            Val::Variant(case.name.to_string(), payload)
        }
        Type::Enum(e) => Val::Enum(e.names().next().unwrap_or_default().to_string()),
        Type::Option(_) => Val::Option(None),
        Type::Result(r) => Val::Result(Ok(match r.ok() {
            Some(t) => Some(Box::new(neutral(store, &t)?)),
            None => None,
        })),
        Type::Flags(_) => Val::Flags(Vec::new()),
        Type::Own(_) => {
            let rep = store.data_mut().next_stub_rep();
            Val::Resource(Resource::<WasiStub>::new_own(rep).try_into_resource_any(&mut *store)?)
        }
        other => {
            return Err(wasmtime::format_err!(
                "WASI stub cannot produce a {other:?}"
            ));
        }
    })
}
