//! Staged rollout of plugin versions, run by weft control: a resource's `spec.rollout.stages` put a new version on
//! a growing set of nodes ([`plan`]), each stage baking for a while, optionally as a shadow first; the figures the
//! nodes report (NACKs, rollbacks, call counts, shadow divergences: [`fleet`]) are judged against the resource's
//! thresholds after every change ([`engine`]); a crossed threshold aborts and every node goes back to the previous
//! version. The state ([`state`]) is persisted ([`store`]) so a restarted weft control resumes at the same stage;
//! [`driver`] runs the steps as the fleet changes and bakes end.

pub mod driver;
pub mod engine;
pub mod fleet;
pub mod plan;
pub mod secret;
pub mod state;
pub mod store;
