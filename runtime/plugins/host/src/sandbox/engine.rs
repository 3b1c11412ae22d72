//! The one wasmtime `Engine`: the pooling allocator sized from the host config (instance slots, memories, tables,
//! the memory cap) and the compile settings (epoch interruption; its ticker is [`super::epoch`]).

use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::base::config::HostConfig;

/// Core instances, tables and memories one plugin component may use (a Rust component has one core module with
/// one memory and one table; wit-component may add small shim modules).
const CORE_INSTANCES_PER_COMPONENT: u32 = 8;
const MEMORIES_PER_COMPONENT: u32 = 1;
const TABLES_PER_COMPONENT: u32 = 4;

/// Builds the engine from the host config: the compile settings plus the pooling allocator.
pub(crate) fn build(cfg: &HostConfig) -> Result<Engine, String> {
    let mut pool = PoolingAllocationConfig::default();
    let slots = cfg.max_instances.max(1);
    pool.total_component_instances(slots)
        .total_core_instances(slots.saturating_mul(CORE_INSTANCES_PER_COMPONENT))
        .total_memories(slots.saturating_mul(MEMORIES_PER_COMPONENT))
        .total_tables(slots.saturating_mul(TABLES_PER_COMPONENT))
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .max_memory_size(cfg.memory_limit);
    let mut config = cfg.engine_settings().config();
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config).map_err(|e| {
        format!(
            "cannot create the wasm engine: {e:#} (the instance pool reserves about {} GiB of address space, \
             never resident: {slots} memory slots of 4 GiB each, so plugin code needs no bounds checks; an \
             address-space limit below that, such as `ulimit -v` or RLIMIT_AS, refuses it)",
            crate::base::compiler::memory_slot_bytes().saturating_mul(u64::from(slots)) >> 30
        )
    })
}
