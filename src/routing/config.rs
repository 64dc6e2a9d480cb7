//! Routing configuration: policy names, assignment modes and SMG's flag defaults.

use std::fmt;
use std::str::FromStr;

/// The routing policy, under SMG's `--policy` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    Random,
    RoundRobin,
    PowerOfTwo,
    CacheAware,
    ConsistentHashing,
    PrefixHash,
    Manual,
    LeastLoad,
}

// === impl PolicyKind ===

impl PolicyKind {
    /// Every policy with its SMG name, in the order SMG documents them.
    pub const ALL: [(PolicyKind, &'static str); 8] = [
        (PolicyKind::Random, "random"),
        (PolicyKind::RoundRobin, "round_robin"),
        (PolicyKind::PowerOfTwo, "power_of_two"),
        (PolicyKind::CacheAware, "cache_aware"),
        (PolicyKind::ConsistentHashing, "consistent_hashing"),
        (PolicyKind::PrefixHash, "prefix_hash"),
        (PolicyKind::Manual, "manual"),
        (PolicyKind::LeastLoad, "least_load"),
    ];

    /// The `--policy` spelling.
    pub fn as_str(self) -> &'static str {
        Self::ALL.iter().find(|(k, _)| *k == self).map_or("", |(_, name)| name)
    }

    /// Whether the policy reads the routing text or tokens (so the lead must scan the body
    /// unless an `X-SMG-Routing-Tokens` hint is present).
    pub fn uses_text(self) -> bool {
        matches!(self, PolicyKind::CacheAware | PolicyKind::PrefixHash)
    }
}

impl FromStr for PolicyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.iter().find(|(_, name)| *name == s).map(|(k, _)| *k).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|(_, n)| *n).collect();
            format!("unknown policy '{s}' (expected one of: {})", names.join(", "))
        })
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a routing key seen for the first time (or whose workers are all gone) picks a worker:
/// `--assignment-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AssignmentMode {
    /// A worker chosen by a hash of the key, so every shard (and every replica that sees the
    /// same workers) places a new key on the same worker. SMG draws at random; a hash has the
    /// same spread and keeps shards in agreement without talking to each other.
    Random,
    /// The available worker with the fewest in-flight requests (ties broken by the key's hash).
    MinLoad,
    /// The available worker holding the fewest keys in this shard's map (ties by the key's hash).
    MinGroup,
    /// The configured policy places the key (SMG's default for `--routing-key-override`).
    /// Under `--policy manual` there is nothing to delegate to, so it acts like `MinLoad`.
    Delegate,
}

// === impl AssignmentMode ===

impl AssignmentMode {
    /// SMG's default when `--assignment-mode` is not given: `random` for `--policy manual`,
    /// `delegate` for the sticky map of `--routing-key-override` on every other policy.
    pub fn default_for(policy: PolicyKind) -> Self {
        if policy == PolicyKind::Manual {
            AssignmentMode::Random
        } else {
            AssignmentMode::Delegate
        }
    }
}

impl FromStr for AssignmentMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "random" => Ok(AssignmentMode::Random),
            "min_load" => Ok(AssignmentMode::MinLoad),
            "min_group" => Ok(AssignmentMode::MinGroup),
            "delegate" => Ok(AssignmentMode::Delegate),
            _ => Err(format!("unknown assignment mode '{s}' (expected one of: random, min_load, min_group, delegate)")),
        }
    }
}

/// Routing flags, with SMG's names and defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingConfig {
    /// `--policy` (default `cache_aware`).
    pub policy: PolicyKind,
    /// `--cache-threshold`: a match ratio above this routes to the prefix's holder.
    pub cache_threshold: f32,
    /// `--balance-abs-threshold`: the spill gate's absolute margin over the mean load.
    pub balance_abs_threshold: usize,
    /// `--balance-rel-threshold`: the spill gate's factor over the mean load.
    pub balance_rel_threshold: f32,
    /// `--eviction-interval`: seconds between tree and sticky-map eviction sweeps.
    pub eviction_interval_secs: u64,
    /// `--max-tree-size`: the cache-aware tree's budget in stored characters (token ids count
    /// as one each; every node is also charged `radix::NODE_CHARGE`), per tree kind per shard.
    pub max_tree_size: usize,
    /// `--prefix-token-count`: tokens hashed by `prefix_hash` (×4 bytes of text when untokenized).
    pub prefix_token_count: usize,
    /// `--prefix-hash-load-factor`: a worker above mean × factor (and above the absolute
    /// threshold) is passed over.
    pub prefix_hash_load_factor: f32,
    /// `--prefix-hash-balance-abs-threshold`.
    pub prefix_hash_balance_abs_threshold: usize,
    /// `--max-idle-secs`: a pinned key unused this long is evicted; 0 never evicts.
    pub max_idle_secs: u64,
    /// `--assignment-mode`. When the flag is absent use [`AssignmentMode::default_for`].
    pub assignment_mode: AssignmentMode,
    /// `--routing-key-override` (alias `--sticky-sessions`).
    pub routing_key_override: bool,
    /// `--routing-key-headers`, lowercased, in priority order.
    pub routing_key_headers: Vec<String>,
    /// `--selection-accounting-ttl-ms`: how long a request's blocks count as held by the
    /// worker it was sent to before that worker's KV-cache events say so (zero: off).
    pub selection_accounting_ttl: std::time::Duration,
}

// === impl RoutingConfig ===

impl Default for RoutingConfig {
    fn default() -> Self {
        RoutingConfig {
            policy: PolicyKind::CacheAware,
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            eviction_interval_secs: 120,
            max_tree_size: 67_108_864,
            prefix_token_count: 256,
            prefix_hash_load_factor: 1.25,
            prefix_hash_balance_abs_threshold: 10,
            max_idle_secs: 14_400,
            assignment_mode: AssignmentMode::default_for(PolicyKind::CacheAware),
            routing_key_override: false,
            routing_key_headers: vec!["x-smg-routing-key".to_string()],
            selection_accounting_ttl: std::time::Duration::ZERO,
        }
    }
}

impl RoutingConfig {
    /// The defaults for a given policy (the assignment mode follows the policy).
    pub fn for_policy(policy: PolicyKind) -> Self {
        RoutingConfig { policy, assignment_mode: AssignmentMode::default_for(policy), ..RoutingConfig::default() }
    }
}
