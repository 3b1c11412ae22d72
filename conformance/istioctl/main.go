// Command istioctl-check decodes a ztunnel-style /config_dump (on stdin) the way `istioctl ztunnel-config` does and
// reports, as JSON on stdout, what its tables would print.
//
// The decoding is istioctl's: the structs in configdump/api.go are istio/istio's, vendored verbatim (see
// README.md), decoded with encoding/json after the same top-level split as ConfigWriter.Prime
// (istioctl/pkg/writer/ztunnel/configdump/configdump.go: services, workloads, policies and certificates as a list or
// a map, workloadState as a map). Beyond a clean decode it reports every field those structs declare without
// `omitempty` that the dump lacks ("missing"), and, per table, the cells that would print blank or as a
// placeholder ("blanks"). The column -> field mapping of each table is this file's own, written after istioctl's
// printers in the same directory (workload.go, services.go, policies.go, certificates.go, connections.go).
//
// Standard library only: it builds offline.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	"weft.example/istioctl-check/configdump"
)

type table struct {
	Columns []string   `json:"columns"`
	Rows    [][]string `json:"rows"`
	Blanks  []string   `json:"blanks"`
}

type report struct {
	Decode  string            `json:"decode"`
	Missing []string          `json:"missing"`
	Tables  map[string]*table `json:"tables"`
}

// prime mirrors ConfigWriter.Prime: the top-level keys istioctl reads, each section a list or a map.
func prime(b []byte) (*configdump.ZtunnelDump, error) {
	var raw struct {
		Services      json.RawMessage                     `json:"services"`
		Workloads     json.RawMessage                     `json:"workloads"`
		Policies      json.RawMessage                     `json:"policies"`
		Certificates  json.RawMessage                     `json:"certificates"`
		WorkloadState map[string]configdump.WorkloadState `json:"workloadstate"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("error unmarshalling config dump response from ztunnel: %v", err)
	}
	d := &configdump.ZtunnelDump{WorkloadState: raw.WorkloadState}
	if err := listOrMap(raw.Services, &d.Services); err != nil {
		return nil, fmt.Errorf("services: %v", err)
	}
	if err := listOrMap(raw.Workloads, &d.Workloads); err != nil {
		return nil, fmt.Errorf("workloads: %v", err)
	}
	if err := listOrMap(raw.Certificates, &d.Certificates); err != nil {
		return nil, fmt.Errorf("certificates: %v", err)
	}
	if err := listOrMap(raw.Policies, &d.Policies); err != nil {
		return nil, fmt.Errorf("policies: %v", err)
	}
	return d, nil
}

func listOrMap[T any](in json.RawMessage, out *[]T) error {
	if len(in) == 0 {
		return nil
	}
	if in[0] == '[' {
		return json.Unmarshal(in, out)
	}
	m := map[string]T{}
	if err := json.Unmarshal(in, &m); err != nil {
		return err
	}
	for _, v := range m {
		*out = append(*out, v)
	}
	return nil
}

var unmarshaler = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()

// missing walks raw JSON beside the Go type it decodes into and lists the declared non-omitempty fields it lacks
// (keys matched as encoding/json matches them: exactly, else without regard to case).
func missing(path string, raw json.RawMessage, t reflect.Type, out *[]string) {
	if len(raw) == 0 || string(raw) == "null" {
		return
	}
	if reflect.PtrTo(t).Implements(unmarshaler) || t.Implements(unmarshaler) {
		return
	}
	switch t.Kind() {
	case reflect.Ptr:
		missing(path, raw, t.Elem(), out)
	case reflect.Slice:
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) == nil {
			for i, it := range items {
				missing(fmt.Sprintf("%s[%d]", path, i), it, t.Elem(), out)
			}
		}
	case reflect.Map:
		var items map[string]json.RawMessage
		if json.Unmarshal(raw, &items) == nil {
			for k, it := range items {
				missing(fmt.Sprintf("%s[%q]", path, k), it, t.Elem(), out)
			}
		}
	case reflect.Struct:
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil {
			return
		}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			name, opts, _ := strings.Cut(tag, ",")
			if name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			v, ok := obj[name]
			if !ok {
				for k, kv := range obj {
					if strings.EqualFold(k, name) {
						v, ok = kv, true
						break
					}
				}
			}
			if !ok {
				if !strings.Contains(opts, "omitempty") {
					*out = append(*out, path+"."+name)
				}
				continue
			}
			missing(path+"."+name, v, f.Type, out)
		}
	}
}

// blank: what a table prints for a value it does not have.
func blank(s string) bool {
	s = strings.TrimSpace(s)
	return s == "" || s == "NA" || s == "<nil>" || s == "." || s == "None" || s == "NA:0"
}

func (t *table) add(key string, row ...string) {
	t.Rows = append(t.Rows, row)
	for i, c := range row {
		if blank(c) && t.Columns[i] != "WAYPOINT" {
			t.Blanks = append(t.Blanks, fmt.Sprintf("%s: %s %q", key, t.Columns[i], c))
		}
	}
}

func newTable(cols ...string) *table {
	return &table{Columns: cols, Rows: [][]string{}, Blanks: []string{}}
}

// waypoint: workload.go's waypointName / serviceWaypointName.
func waypoint(gw *configdump.GatewayAddress, svcs []*configdump.ZtunnelService) string {
	if gw == nil {
		return "None"
	}
	for _, s := range svcs {
		if s.Namespace+"/"+s.Hostname == gw.Destination {
			return s.Name
		}
		for _, a := range s.Addresses {
			if a == gw.Destination {
				return s.Name
			}
		}
	}
	return "NA"
}

func workloads(d *configdump.ZtunnelDump) *table {
	// workload.go PrintWorkloadSummary.
	t := newTable("NAMESPACE", "POD NAME", "ADDRESS", "NODE", "WAYPOINT", "PROTOCOL")
	for _, w := range d.Workloads {
		addr := strings.Join(w.WorkloadIPs, ",")
		if addr == "" {
			addr = w.Hostname
		}
		t.add(w.UID, w.Namespace, w.Name, addr, w.Node, waypoint(w.Waypoint, d.Services), w.Protocol)
	}
	return t
}

func services(d *configdump.ZtunnelDump) *table {
	// services.go PrintServiceSummary: VIPs are the part after "network/"; ENDPOINTS healthy/all, healthy meaning
	// the endpoint's workload (by uid) has status Healthy.
	t := newTable("NAMESPACE", "SERVICE NAME", "SERVICE VIP", "WAYPOINT", "ENDPOINTS")
	byUID := map[string]*configdump.ZtunnelWorkload{}
	for _, w := range d.Workloads {
		byUID[w.UID] = w
	}
	for _, s := range d.Services {
		ips := []string{}
		for _, a := range s.Addresses {
			_, ip, _ := strings.Cut(a, "/")
			ips = append(ips, ip)
		}
		healthy := 0
		for _, ep := range s.Endpoints {
			if w, ok := byUID[ep.WorkloadUID]; ok && w.Status == "Healthy" {
				healthy++
			}
		}
		eps := fmt.Sprintf("%d/%d", healthy, len(s.Endpoints))
		if len(s.Endpoints) == 0 {
			eps = "" // 0/0: no endpoint listed
		}
		t.add(s.Hostname, s.Namespace, s.Name, strings.Join(ips, ","), waypoint(s.Waypoint, d.Services), eps)
	}
	return t
}

func policies(d *configdump.ZtunnelDump) *table {
	// policies.go PrintPolicySummary.
	t := newTable("NAMESPACE", "POLICY NAME", "ACTION", "SCOPE")
	for _, p := range d.Policies {
		t.add(p.Namespace+"/"+p.Name, p.Namespace, p.Name, p.Action, p.Scope)
	}
	return t
}

func certificates(d *configdump.ZtunnelDump) *table {
	// certificates.go PrintSecretSummary: a row per chain certificate (Leaf, Intermediate) and per root (Root);
	// VALID CERT is now within [validFrom, expirationTime] (RFC 3339); SERIAL NUMBER is the base-10 serial printed
	// in hex; NOT AFTER / NOT BEFORE print NA when empty.
	t := newTable("CERTIFICATE NAME", "TYPE", "STATUS", "VALID CERT", "SERIAL NUMBER", "NOT AFTER", "NOT BEFORE")
	valid := func(c *configdump.Cert) string {
		exp, err1 := time.Parse(time.RFC3339, c.ExpirationTime)
		from, err2 := time.Parse(time.RFC3339, c.ValidFrom)
		now := time.Now()
		return fmt.Sprint(err1 == nil && err2 == nil && now.After(from) && now.Before(exp))
	}
	serial := func(c *configdump.Cert) string {
		n, ok := new(big.Int).SetString(c.SerialNumber, 10)
		if !ok {
			return ""
		}
		return fmt.Sprintf("%x", n)
	}
	na := func(s string) string {
		if s == "" {
			return "NA"
		}
		return s
	}
	for _, s := range d.Certificates {
		state := s.State
		if strings.Contains(state, "Unavailable") {
			state = "Unavailable"
		}
		if len(s.CertChain) == 0 {
			t.add(s.Identity, s.Identity, "NA", state, "false", "NA", "NA", "NA")
			continue
		}
		legacy := len(s.RootCert) == 0
		for i, c := range s.CertChain {
			kind := "Intermediate"
			if i == 0 {
				kind = "Leaf"
			} else if i == len(s.CertChain)-1 && legacy {
				kind = "Root"
			}
			t.add(s.Identity, s.Identity, kind, state, valid(c), serial(c), na(c.ExpirationTime), na(c.ValidFrom))
		}
		for _, c := range s.RootCert {
			t.add(s.Identity, s.Identity, "Root", state, valid(c), serial(c), na(c.ExpirationTime), na(c.ValidFrom))
		}
	}
	for i, r := range t.Rows {
		if r[3] != "true" {
			t.Blanks = append(t.Blanks, fmt.Sprintf("%s: VALID CERT %q (row %d)", r[0], r[3], i))
		}
	}
	return t
}

func connections(d *configdump.ZtunnelDump) *table {
	// connections.go PrintConnectionsSummary: addresses of a service's first VIP or a workload's first IP print as
	// its name (service hostname, workload name.namespace) with the port.
	t := newTable("WORKLOAD", "DIRECTION", "LOCAL", "REMOTE", "REMOTE TARGET", "PROTOCOL")
	names := map[string]string{}
	for _, s := range d.Services {
		if len(s.Addresses) != 0 {
			_, ip, _ := strings.Cut(s.Addresses[0], "/")
			names[ip] = s.Hostname
		}
	}
	for _, w := range d.Workloads {
		if len(w.WorkloadIPs) != 0 {
			names[w.WorkloadIPs[0]] = w.Name + "." + w.Namespace
		}
	}
	lookup := func(addr string) string {
		ip, port, err := net.SplitHostPort(addr)
		if err != nil {
			return addr
		}
		if n, ok := names[ip]; ok {
			return net.JoinHostPort(n, port)
		}
		return addr
	}
	keys := []string{}
	for k := range d.WorkloadState {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		w := d.WorkloadState[k]
		name := w.Info.Name + "." + w.Info.Namespace
		for _, c := range w.Connections.Inbound {
			t.add(k, name, "Inbound", lookup(c.ActualDst), lookup(c.Src), c.OriginalDst, c.Protocol)
		}
		for _, c := range w.Connections.Outbound {
			t.add(k, name, "Outbound", lookup(c.Src), lookup(c.ActualDst), lookup(c.OriginalDst), c.Protocol)
		}
	}
	return t
}

func main() {
	b, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	r := report{Decode: "ok", Missing: []string{}, Tables: map[string]*table{}}
	d, err := prime(b)
	if err != nil {
		r.Decode = err.Error()
	} else {
		var top map[string]json.RawMessage
		_ = json.Unmarshal(b, &top)
		for _, name := range []string{"workloads", "services", "policies", "certificates", "workloadState"} {
			f, _ := reflect.TypeOf(configdump.ZtunnelDump{}).FieldByNameFunc(func(n string) bool {
				return strings.EqualFold(n, name)
			})
			var raw json.RawMessage
			for k, v := range top {
				if strings.EqualFold(k, name) {
					raw = v
				}
			}
			if raw == nil {
				r.Missing = append(r.Missing, name)
				continue
			}
			t := f.Type
			if raw[0] == '{' && t.Kind() == reflect.Slice {
				t = reflect.MapOf(reflect.TypeOf(""), t.Elem())
			}
			missing(name, raw, t, &r.Missing)
		}
		sort.Strings(r.Missing)
		r.Tables["workloads"] = workloads(d)
		r.Tables["services"] = services(d)
		r.Tables["policies"] = policies(d)
		r.Tables["certificates"] = certificates(d)
		r.Tables["connections"] = connections(d)
	}
	out, _ := json.MarshalIndent(r, "", "  ")
	fmt.Println(string(out))
}
