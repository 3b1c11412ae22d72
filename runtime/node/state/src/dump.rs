//! The mesh sections of `/config_dump` (`workloads`, `services`, `policies`) in ztunnel's shape, the one
//! `istioctl ztunnel-config` decodes (istio/istio `istioctl/pkg/writer/ztunnel/configdump/api.go`): the model's own
//! serialization, plus what ztunnel computes for the dump, a service's `endpoints`.

use serde_json::{Value, json};

use crate::mesh::MeshState;

impl MeshState {
    /// Every workload, as ztunnel dumps it (`workloadIps`, `status`, ...), with weft's extra fields.
    pub fn dump_workloads(&self) -> Vec<Value> {
        self.workloads
            .values()
            .map(|w| serde_json::to_value(w.as_ref()).unwrap_or_default())
            .collect()
    }

    /// Every service, as ztunnel dumps it: `vips` as `network/IP`, and its `endpoints` by workload uid, each with
    /// the workload's uid, the service, its first address (`network/IP`), its port map and health.
    pub fn dump_services(&self) -> Vec<Value> {
        self.services
            .values()
            .map(|svc| {
                let mut v = serde_json::to_value(svc.as_ref()).unwrap_or_default();
                let key = svc.key();
                let endpoints: serde_json::Map<String, Value> = self
                    .endpoints_of(&key)
                    .iter()
                    .map(|w| {
                        let mut ep = json!({
                            "workloadUid": w.uid,
                            "service": key,
                            "port": w.services.get(&key).cloned().unwrap_or_default(),
                            "status": if w.healthy { "Healthy" } else { "Unhealthy" },
                        });
                        if let Some(ip) = w.addresses.first() {
                            ep["address"] = json!(format!("{}/{ip}", w.network));
                        }
                        (w.uid.clone(), ep)
                    })
                    .collect();
                if let Value::Object(o) = &mut v {
                    o.insert("endpoints".to_owned(), Value::Object(endpoints));
                }
                v
            })
            .collect()
    }

    /// Every authorization policy, as ztunnel dumps it (`Allow`, `WorkloadSelector`, `{"Presence": []}`, ...).
    pub fn dump_policies(&self) -> Vec<Value> {
        self.policies
            .values()
            .map(|p| serde_json::to_value(p.as_ref()).unwrap_or_default())
            .collect()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn dump_is_ztunnels_shape() {
        let yaml = r#"
workloads:
- uid: w1
  name: w1
  namespace: ns
  workloadIps: [10.0.0.1]
  protocol: HBONE
  node: n
  status: Unhealthy
  services: {ns/s.example: {80: 8080}}
services:
- name: s
  namespace: ns
  hostname: s.example
  vips: ["net1/10.1.0.1"]
  ports: {80: 8080}
policies:
- name: p
  namespace: ns
  scope: WorkloadSelector
  action: Allow
  rules: [[[{principals: [!Presence [], !Exact a/b]}]]]
"#;
        let state = crate::local::parse(yaml, std::path::Path::new("."))
            .unwrap()
            .into_state(1);
        let w = &state.dump_workloads()[0];
        assert_eq!(w["workloadIps"], serde_json::json!(["10.0.0.1"]), "{w}");
        assert_eq!(w["status"], "Unhealthy", "{w}");
        assert_eq!(w["networkMode"], "Standard", "{w}");
        let s = &state.dump_services()[0];
        assert_eq!(s["vips"], serde_json::json!(["net1/10.1.0.1"]), "{s}");
        assert_eq!(
            s["endpoints"]["w1"],
            serde_json::json!({"workloadUid": "w1", "service": "ns/s.example", "address": "/10.0.0.1",
                "port": {"80": 8080}, "status": "Unhealthy"}),
            "{s}"
        );
        let p = &state.dump_policies()[0];
        assert_eq!(p["action"], "Allow");
        assert_eq!(p["scope"], "WorkloadSelector");
        assert_eq!(
            p["rules"][0][0][0]["principals"],
            serde_json::json!([{"Presence": []}, {"Exact": "a/b"}]),
            "{p}"
        );
    }
}
