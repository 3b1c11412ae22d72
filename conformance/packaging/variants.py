"""The values the chart is rendered, linted and validated with: the default (cluster) install and each variant an
operator is expected to use."""

# The mesh file of the trial variant, as an operator passes it (`--set-file trial.mesh=mesh.yaml`).
TRIAL_MESH = """\
workloads:
- uid: Kubernetes//Pod/default/echo-1
  name: echo-1
  namespace: default
  serviceAccount: echo
  workloadIps: [10.0.0.2]
  protocol: HBONE
  node: kind-control-plane
  services:
    default/echo.default.svc.cluster.local: {80: 8080}
services:
- name: echo
  namespace: default
  hostname: echo.default.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports: {80: 8080}
policies: []
"""

VARIANTS = {
    "default": {},
    "trial-local-ca": {
        "trial": {"enabled": True, "node": "kind-control-plane", "caSecretName": "weft-trial-ca", "mesh": TRIAL_MESH},
        "mode": "node",
    },
    "plugins-from-configmap": {
        "plugins": {
            "configMap": "my-plugins",
            "local": [
                {
                    "name": "allowlist",
                    "kind": "policy",
                    "path": "port_allowlist.wasm",
                    "sha256": "0" * 64,
                    "config": {"ports": [8080, "9000-9099"], "deny_message": "port not allowed"},
                    "failurePolicy": "failClosed",
                    "directions": ["inbound"],
                    "selector": {"namespaces": ["shop"]},
                }
            ],
        }
    },
    "podmonitor": {"metrics": {"podMonitor": {"enabled": True, "labels": {"release": "prometheus"}}}},
    # Beside Istio's ztunnel chart (README: Migrating from ztunnel), with every ztunnel-compatibility value set.
    "migration-from-ztunnel": {"migration": {"fromZtunnel": True}, "ztunnelLabels": True},
    "ztunnel-compatible": {
        "migration": {"fromZtunnel": True},
        "ztunnelLabels": True,
        "network": "network-east",
        "seLinuxOptions": {"type": "spc_t"},
        "imagePullSecrets": ["regcred", {"name": "mirror-creds"}],
        "istio": {
            "caAddress": "istiod.istio-system.svc:15012",
            "xdsAddress": "istiod.istio-system.svc:15012",
            "clusterTrustBundle": "istio.io:istiod-ca:root-cert",
        },
    },
    "custom-service-account": {"serviceAccount": {"create": True, "name": "weft-node", "annotations": {"a": "b"}}},
    # The control plane as installed by default: the WeftPlugin controller (plugins.source crd), two replicas.
    "control-plane": {"control": {"enabled": True, "tls": {"secretName": "weft-control-tls"}}},
    # The WeftPlugin files of a ConfigMap, as before the controller.
    "control-plane-configmap": {
        "control": {
            "enabled": True,
            "plugins": {"source": "configMap"},
            "pluginsConfigMap": "weft-plugins",
            "tls": {"secretName": "weft-control-tls"},
        }
    },
    # Pull Secrets readable in two namespaces only, one replica (no PodDisruptionBudget), another root namespace.
    "control-plane-scoped": {
        "control": {
            "enabled": True,
            "replicas": 1,
            "plugins": {"rootNamespace": "mesh-root", "pullSecretNamespaces": ["shop", "payments"]},
            "tls": {"secretName": "weft-control-tls"},
        }
    },
    "everything": {
        "image": {"digest": "sha256:" + "ab" * 32},
        "imagePullSecrets": ["regcred"],
        "istio": {"revision": "canary", "clusterId": "east"},
        "plugins": {"pullSecret": "oci-creds", "defaults": False, "compileCache": False},
        "dns": {"enabled": False},
        "podLabels": {"team": "mesh"},
        "podAnnotations": {"example.com/owner": "mesh"},
        "env": {"RUST_BACKTRACE": "1"},
        "extraVolumes": [{"name": "extra", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "extra", "mountPath": "/extra"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "mesh", "operator": "In", "values": ["yes"]}]}
                    ]
                }
            }
        },
        "nodeSelector": {"pool": "mesh"},
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "10%", "maxUnavailable": 0}},
        "control": {
            "enabled": True,
            "tls": {"secretName": "weft-control-tls"},
            "replicas": 3,
            "podDisruptionBudget": {"enabled": True},
            "plugins": {"source": "crd", "rootNamespace": "istio-system", "pullSecretNamespaces": ["shop"]},
        },
        "metrics": {"podMonitor": {"enabled": True}},
    },
}
