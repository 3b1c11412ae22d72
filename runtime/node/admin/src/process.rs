//! ztunnel's process-wide metrics, under its names and labels, for Istio's ztunnel dashboard.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

/// ztunnel's process-wide metrics under its names and labels (Istio's ztunnel dashboard reads them):
/// `istio_build{component="ztunnel",tag}` (1; `tag` is the Istio release weft stands in for, as ztunnel's is the
/// Istio version: `ISTIO_META_ISTIO_VERSION`, else the release weft reports to istiod; the node decides), and `process_open_fds` /
/// `process_max_fds` (the process's open descriptors and their soft limit).
#[derive(Debug)]
pub struct ProcessCollector {
    /// The `tag` label of `istio_build`.
    pub istio_version: String,
}

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = enc.encode_descriptor(
            "istio_build",
            "Istio component build info",
            None,
            MetricType::Gauge,
        )?;
        let labels = [
            ("component", "ztunnel"),
            ("tag", self.istio_version.as_str()),
        ];
        ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
        // The directory's own descriptor is not counted (as ztunnel does).
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            let open = i64::try_from(dir.count()).unwrap_or(i64::MAX) - 1;
            let m = enc.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(open).encode(m)?;
        }
        let max = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|l| {
                l.lines()
                    .find(|l| l.starts_with("Max open files"))?
                    .split_whitespace()
                    .nth(3)?
                    .parse::<i64>()
                    .ok()
            });
        if let Some(max) = max {
            let m = enc.encode_descriptor(
                "process_max_fds",
                "Maximum number of open file descriptors",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(max).encode(m)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic fails the test

    use super::*;
    use prometheus_client::registry::Registry;

    #[test]
    fn ztunnel_collector_has_istio_build_and_process_fds() {
        let mut reg = Registry::default();
        reg.register_collector(Box::new(ProcessCollector {
            istio_version: "1.32.0".into(),
        }));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(text.contains("# TYPE istio_build gauge"), "{text}");
        assert!(
            text.contains("istio_build{component=\"ztunnel\",tag=\"1.32.0\"} 1"),
            "{text}"
        );
        let open: i64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_open_fds "))
            .expect("process_open_fds")
            .parse()
            .unwrap();
        assert!(open > 2, "{text}");
        assert!(text.contains("# TYPE process_max_fds gauge"), "{text}");
    }
}
