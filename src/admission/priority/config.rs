//! The priority scheduler's settings: SMG's four classes, their built-in defaults, and the
//! optional `--priority-scheduler-config` YAML (SMG's schema: `classes.<class>` with
//! `reserved_floor`, `reserved_per_slot`, `queue_size`, `queue_timeout_secs`,
//! `starvation_threshold_secs`, `can_preempt`; `tenant_policies.<tenant>.max_class`), so an
//! SMG file works unchanged. A file that cannot be read, parsed or validated is a start-up
//! error that names the file and, for a parse error, the line.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;

/// A request's priority class. Ordered: `Bulk < Default < Interactive < System`, so the
/// tenant clamp is `min(requested, max_class)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    Bulk = 0,
    Default = 1,
    Interactive = 2,
    System = 3,
}

impl Class {
    /// Lowest first.
    pub const ALL: [Class; 4] = [Class::Bulk, Class::Default, Class::Interactive, Class::System];

    /// `X-SMG-Priority`'s value: case-insensitive, trimmed; anything else is `default`.
    pub fn parse_header(v: &[u8]) -> Class {
        let v = v.trim_ascii();
        if v.eq_ignore_ascii_case(b"interactive") {
            Class::Interactive
        } else if v.eq_ignore_ascii_case(b"bulk") {
            Class::Bulk
        } else if v.eq_ignore_ascii_case(b"system") {
            Class::System
        } else {
            Class::Default
        }
    }

    pub fn parse_name(s: &str) -> Option<Class> {
        Some(match s {
            "system" => Class::System,
            "interactive" => Class::Interactive,
            "default" => Class::Default,
            "bulk" => Class::Bulk,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Class::Bulk => "bulk",
            Class::Default => "default",
            Class::Interactive => "interactive",
            Class::System => "system",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// One class's settings (SMG's `ClassConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// Slots kept for this class (and higher ones may not take them... lower ones may not).
    pub reserved_floor: u16,
    /// Share of capacity reserved on top of the floor: `max(floor, ceil(share × capacity))`.
    #[serde(default)]
    pub reserved_per_slot: f64,
    /// Waiters this class may queue, gateway-wide.
    pub queue_size: u32,
    pub queue_timeout_secs: u64,
    /// A head waiter older than this is admitted ahead of higher classes, reservations
    /// ignored.
    pub starvation_threshold_secs: u64,
    /// May preempt a lower class's in-flight request that has sent nothing to its client.
    pub can_preempt: bool,
}

impl ClassConfig {
    /// SMG's built-in defaults.
    pub fn default_for(c: Class) -> Self {
        let (reserved_floor, reserved_per_slot, queue_size, queue_timeout_secs, starvation_threshold_secs, can_preempt) =
            match c {
                Class::System => (32, 0.0, 64, 30, 5, true),
                Class::Interactive => (128, 0.25, 256, 30, 5, true),
                Class::Default => (0, 0.10, 512, 60, 30, false),
                Class::Bulk => (0, 0.0, 1024, 300, 120, false),
            };
        ClassConfig {
            reserved_floor,
            reserved_per_slot,
            queue_size,
            queue_timeout_secs,
            starvation_threshold_secs,
            can_preempt,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantPolicy {
    max_class: Class,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    classes: HashMap<Class, ClassConfig>,
    #[serde(default)]
    tenant_policies: HashMap<String, TenantPolicy>,
}

/// The validated scheduler settings every shard reads.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Indexed by [`Class::index`].
    pub classes: [ClassConfig; 4],
    pub default_max_class: Class,
    /// Tenant identity (`auth:<tenant>`, `header:<value>`, as the access log names it) →
    /// its highest class.
    pub tenants: HashMap<String, Class>,
    /// Capacity when no routable worker is known: `--max-concurrent-requests` when set,
    /// else SMG's 1,024.
    pub fallback_capacity: usize,
}

/// Slots a worker counts for when it reports no `max_running_requests` (SMG's estimate).
pub const SLOTS_PER_UNREPORTED_WORKER: usize = 64;
/// Capacity with no routable worker and no `--max-concurrent-requests` (SMG's).
pub const FALLBACK_CAPACITY: usize = 1024;

impl SchedulerConfig {
    /// From the flags and the optional file.
    pub fn new(default_max_class: &str, file: Option<&std::path::Path>, max_concurrent: i64) -> Result<Self, String> {
        let default_max_class = Class::parse_name(default_max_class).ok_or_else(|| {
            format!(
                "--priority-scheduler-default-max-class: unknown priority class `{default_max_class}` (system, interactive, default or bulk)"
            )
        })?;
        let parsed = match file {
            None => FileConfig::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("--priority-scheduler-config {}: {e}", path.display()))?;
                Self::parse(&text).map_err(|e| format!("--priority-scheduler-config {}: {e}", path.display()))?
            }
        };
        let mut classes = Class::ALL.map(ClassConfig::default_for);
        for (c, cfg) in parsed.classes {
            classes[c.index()] = cfg;
        }
        for c in Class::ALL {
            let cfg = &classes[c.index()];
            let fail = |what: &str| {
                let file = file.map(|p| format!(" {}", p.display())).unwrap_or_default();
                Err(format!("--priority-scheduler-config{file}: class `{}`: {what}", c.as_str()))
            };
            if let Err(e) = crate::duration::secs("queue_timeout_secs", cfg.queue_timeout_secs, 1) {
                return fail(&e);
            }
            if let Err(e) = crate::duration::secs("starvation_threshold_secs", cfg.starvation_threshold_secs, 1) {
                return fail(&e);
            }
            if !cfg.reserved_per_slot.is_finite() || cfg.reserved_per_slot < 0.0 {
                return fail("reserved_per_slot must be finite and >= 0");
            }
        }
        Ok(SchedulerConfig {
            classes,
            default_max_class,
            tenants: parsed.tenant_policies.into_iter().map(|(k, v)| (k, v.max_class)).collect(),
            fallback_capacity: if max_concurrent > 0 { max_concurrent as usize } else { FALLBACK_CAPACITY },
        })
    }

    /// serde_yaml's messages carry the line and column ("... at line 3 column 5").
    fn parse(text: &str) -> Result<FileConfig, String> {
        if text.trim().is_empty() {
            return Ok(FileConfig::default());
        }
        serde_yaml::from_str::<FileConfig>(text).map_err(|e| match e.location() {
            Some(l) if !e.to_string().contains(" at line ") => format!("line {}: {e}", l.line()),
            _ => e.to_string(),
        })
    }

    pub fn class(&self, c: Class) -> &ClassConfig {
        &self.classes[c.index()]
    }

    pub fn queue_timeout(&self, c: Class) -> Duration {
        Duration::from_secs(self.class(c).queue_timeout_secs)
    }

    pub fn starvation(&self, c: Class) -> Duration {
        Duration::from_secs(self.class(c).starvation_threshold_secs)
    }

    /// The tenant's highest class.
    pub fn max_class(&self, tenant: Option<&str>) -> Class {
        tenant.and_then(|t| self.tenants.get(t).copied()).unwrap_or(self.default_max_class)
    }

    /// Per-class reservations at `capacity`: `max(floor, ceil(share × capacity))`; when
    /// those do not all fit under the capacity, scaled down in proportion to fit in half of
    /// it; then clamped in priority order (the highest classes kept whole) so they never
    /// sum past it.
    ///
    /// Why scale: SMG's class defaults reserve at least 160 slots (system 32, interactive
    /// 128). On a smaller fleet — 64 slots is what one worker that reports no
    /// `max_running_requests` counts for — the floors took every slot, and on an idle
    /// gateway a `default` request waited 30 s and a `bulk` one 120 s for starvation
    /// promotion. SMG 1.13 refuses such a configuration and falls back to plain admission,
    /// which answers at once but keeps no class apart. Scaled, every class keeps its order
    /// and a share, and half the slots stay open to any class. Reservations that fit are
    /// kept as configured, as SMG keeps them.
    pub fn reservations(&self, capacity: usize) -> [usize; 4] {
        let mut want = Class::ALL.map(|c| {
            let cfg = self.class(c);
            let share = (cfg.reserved_per_slot * capacity as f64).ceil();
            let share = if share.is_finite() && share >= 0.0 { share as usize } else { 0 };
            usize::from(cfg.reserved_floor).max(share).min(capacity)
        });
        let total: usize = want.iter().sum();
        if total > capacity {
            want = want.map(|w| w * (capacity / 2) / total);
        }
        let mut left = capacity;
        let mut out = [0; 4];
        for c in Class::ALL.iter().rev() {
            let give = want[c.index()].min(left);
            out[c.index()] = give;
            left -= give;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(yaml: &str) -> String {
        let dir = tempfile::Builder::new().prefix("smg-prio-").tempfile().unwrap().into_temp_path();
        std::fs::write(&dir, yaml).unwrap();
        let e = SchedulerConfig::new("default", Some(&*dir), -1).unwrap_err();
        assert!(e.contains(&dir.display().to_string()), "names the file: {e}");
        e
    }

    #[test]
    fn header_values() {
        assert_eq!(Class::parse_header(b" Interactive "), Class::Interactive);
        assert_eq!(Class::parse_header(b"BULK"), Class::Bulk);
        assert_eq!(Class::parse_header(b"vip"), Class::Default);
        assert_eq!(Class::parse_header(b""), Class::Default);
    }

    #[test]
    fn smg_file_parses_and_merges() {
        let text = "classes:\n  bulk:\n    reserved_floor: 0\n    queue_size: 4\n    queue_timeout_secs: 1\n    starvation_threshold_secs: 2\n    can_preempt: false\ntenant_policies:\n  \"auth:acme\":\n    max_class: interactive\n";
        let p = tempfile::Builder::new().prefix("smg-prio-ok-").tempfile().unwrap().into_temp_path();
        std::fs::write(&p, text).unwrap();
        let c = SchedulerConfig::new("bulk", Some(&*p), -1).unwrap();
        assert_eq!(c.class(Class::Bulk).queue_size, 4);
        assert_eq!(c.class(Class::Interactive), &ClassConfig::default_for(Class::Interactive));
        assert_eq!(c.max_class(Some("auth:acme")), Class::Interactive);
        assert_eq!(c.max_class(Some("auth:other")), Class::Bulk);
    }

    #[test]
    fn bad_files_name_file_and_line() {
        let e = err("classes:\n  bulk:\n    reserved_floor: [\n");
        assert!(e.contains("line"), "{e}");
        let e = err("classes:\n  vip:\n    reserved_floor: 1\n");
        assert!(e.contains("vip") && e.contains("line 2"), "{e}");
        let e = err("classes:\n  bulk:\n    reserved_floor: -3\n    queue_size: 1\n    queue_timeout_secs: 1\n    starvation_threshold_secs: 1\n    can_preempt: false\n");
        assert!(e.contains("line 3") && e.contains("-3"), "{e}");
        let e = err("tenant_policies:\n  a:\n    max_class: gold\n");
        assert!(e.contains("gold") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn reservations_clamp_highest_first() {
        let c = SchedulerConfig::new("default", None, -1).unwrap();
        // At 1,000 the defaults fit as configured: system 32, interactive 250, default 100.
        assert_eq!(c.reservations(1000), [0, 100, 250, 32]);
        // At 64 (one worker reporting no capacity) they want 7 + 64 + 32: scaled to 32 or less.
        assert_eq!(c.reservations(64), [0, 2, 19, 9]);
        // At 4 slots, nothing is left to reserve after scaling.
        assert_eq!(c.reservations(4), [0, 0, 0, 0]);
        // Floors that fit exactly are kept (a YAML that gives one class every slot).
        let mut cfg = c.clone();
        cfg.classes[Class::System.index()].reserved_floor = 0;
        cfg.classes[Class::Interactive.index()].reserved_floor = 4;
        cfg.classes[Class::Default.index()].reserved_per_slot = 0.0;
        assert_eq!(cfg.reservations(4), [0, 0, 4, 0]);
    }
}
