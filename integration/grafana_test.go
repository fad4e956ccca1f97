package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"keyway/agent"
	"keyway/balancer"
	"keyway/config"
	"keyway/eventlog"
	"keyway/health"
	"keyway/internal/slow"
	"keyway/internal/stacktest"
	"keyway/membership"
	"keyway/proxy"
)

// dashboardPath is the Grafana dashboard keyway ships.
const dashboardPath = "../deploy/grafana/keyway.json"

var (
	exprMetric = regexp.MustCompile(`keyway_[a-z_]+`)
	descName   = regexp.MustCompile(`fqName: "([^"]+)"`)
)

// registeredMetrics is what keyway exports: the metric families a running
// stack (serve with static replicas, gossip and both health checks on,
// after real requests and a failure) shows on its admin /metrics, with
// their types, plus the families its components register that have no
// series yet (a vector shows on /metrics only once it has a child).
type registeredMetrics struct {
	types      map[string]string // from # TYPE lines: counter, gauge, histogram, ...
	registered map[string]bool   // scraped or described
}

// known reports whether an expression may name m: a registered family, or
// a histogram's (or summary's) _bucket, _sum or _count series.
func (r registeredMetrics) known(m string) bool {
	if r.registered[m] {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(m, suf); ok {
			if t := r.types[base]; t == "histogram" || (t == "summary" && suf != "_bucket") {
				return true
			}
		}
	}
	return false
}

// scrapeMetrics runs the stack, drives some traffic and a failure through
// it and collects the # HELP / # TYPE names of /metrics.
func scrapeMetrics(t *testing.T) registeredMetrics {
	t.Helper()
	st := stacktest.StartOrders(t)
	owned := ""
	for i := range 40 {
		key := fmt.Sprintf("k-%d", i)
		if st.Send(t, key) == "orders-0" && owned == "" {
			owned = key
		}
	}
	// A stopped replica: upstream errors, an ejection, a rotation change.
	st.StopReplica["orders-0"]()
	if owned != "" {
		st.Send(t, owned)
	}
	stacktest.WaitRotation(t, st.Admin, "orders", 2)

	resp, err := http.Get("http://" + st.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := registeredMetrics{types: map[string]string{}, registered: map[string]bool{}}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[0] == "#" && (f[1] == "HELP" || f[1] == "TYPE") {
			r.registered[f[2]] = true
			if f[1] == "TYPE" && len(f) >= 4 {
				r.types[f[2]] = f[3]
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return r
}

// descRecorder is a prometheus.Registerer that records the names of every
// collector's descriptors.
type descRecorder struct{ names map[string]bool }

func (d *descRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := descName.FindStringSubmatch(desc.String()); m != nil {
			d.names[m[1]] = true
		}
	}
	return nil
}

func (d *descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d *descRecorder) Unregister(prometheus.Collector) bool { return true }

// describeMetrics builds keyway's metric-registering components as serve
// does and records every family they register.
func describeMetrics(t *testing.T) map[string]bool {
	t.Helper()
	cfg, err := config.LoadBytes("describe.yaml", []byte(`listen: 127.0.0.1:0
gossip: {enabled: true, bind_addr: 127.0.0.1, bind_port: 0}
health: {active: {enabled: true, path: /healthz}, passive: {enabled: true}}
replica_sets:
  - name: orders
    replicas: 1
    static: [{name: orders-0, addr: "127.0.0.1:1"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	rec := &descRecorder{names: map[string]bool{}}
	if _, err := eventlog.New(cfg.Audit, "describe", eventlog.Options{Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := health.NewChecker(cfg.Health, noSink{}, health.Options{Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := health.NewPhaseTracker(rec, nil); err != nil {
		t.Fatal(err)
	}
	// An agent that supervises a process registers every keyway_agent_
	// family: the runtime's, and the supervisor's child_* ones (as
	// server's buildAgent wires them). They bind and start nothing.
	acfg := agent.DefaultConfig()
	acfg.Listen = ""
	acfg.Replica.Set, acfg.Replica.Name, acfg.Replica.Addr = "orders", "orders-0", "127.0.0.1:1"
	acfg.Gossip.Join = []string{"127.0.0.1:1"}
	acfg.Command = []string{"true"}
	if _, err := agent.New(acfg, agent.Options{Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.NewSupervisor(acfg.Command, acfg.Supervise, agent.SupervisorOptions{Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	p, err := proxy.New(cfg.Config, proxy.Options{Registerer: rec})
	if err != nil {
		t.Fatal(err)
	}
	disc := membership.NewDiscovery(p, membership.DiscoveryOptions{Registerer: rec})
	if _, err := membership.New(cfg.Gossip.Config, membership.Meta{Role: membership.RoleProxy}, membership.Options{Registerer: rec, Sink: disc}); err != nil {
		t.Fatal(err)
	}
	return rec.names
}

// noSink is a health.Sink that drops what it is told.
type noSink struct{}

func (noSink) SetExcluded(string, string, balancer.Reason, bool) {}

// dashboardExprs returns every PromQL expression of the dashboard: panel
// targets (rows' nested panels included) and template variable queries,
// each with where it is.
func dashboardExprs(t *testing.T, raw []byte) map[string]string {
	t.Helper()
	var d struct {
		SchemaVersion int             `json:"schemaVersion"`
		Inputs        json.RawMessage `json:"__inputs"`
		Panels        []dashPanel     `json:"panels"`
		Templating    struct {
			List []struct {
				Name       string          `json:"name"`
				Type       string          `json:"type"`
				Query      json.RawMessage `json:"query"`
				Datasource *dashDatasource `json:"datasource"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d, want a current one (39)", d.SchemaVersion)
	}
	// File provisioning does not resolve __inputs (${DS_...} stays a
	// literal uid that names no datasource): the datasource is a template
	// variable, which an import in the UI fills as well.
	if d.Inputs != nil || strings.Contains(string(raw), "${DS_") {
		t.Errorf("the dashboard has __inputs or a ${DS_...} reference; use the datasource variable ${%s}", dsVar)
	}
	if len(d.Templating.List) == 0 || d.Templating.List[0].Name != dsVar || d.Templating.List[0].Type != "datasource" || string(d.Templating.List[0].Query) != `"prometheus"` {
		t.Errorf("the first template variable is not {name: %s, type: datasource, query: prometheus}", dsVar)
	}
	checkDS := func(where string, ds *dashDatasource) {
		if ds == nil || ds.Type != "prometheus" || ds.UID != "${"+dsVar+"}" {
			t.Errorf("%s: datasource %+v, want {type: prometheus, uid: ${%s}}", where, ds, dsVar)
		}
	}
	exprs := map[string]string{}
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			if p.Type != "row" {
				checkDS(fmt.Sprintf("panel %q", p.Title), p.Datasource)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q target %s has no expr", p.Title, tg.RefID)
				}
				if tg.Datasource != nil {
					checkDS(fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), tg.Datasource)
				}
				exprs[fmt.Sprintf("panel %q target %s", p.Title, tg.RefID)] = tg.Expr
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no targets", p.Title)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		checkDS("variable "+v.Name, v.Datasource)
		var q struct {
			Query string `json:"query"`
		}
		var s string
		if json.Unmarshal(v.Query, &s) == nil {
			q.Query = s
		} else if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("variable %s: query %s: %v", v.Name, v.Query, err)
		}
		exprs["variable "+v.Name] = q.Query
	}
	return exprs
}

// dsVar names the dashboard's datasource variable.
const dsVar = "datasource"

type dashDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashPanel struct {
	Title      string          `json:"title"`
	Type       string          `json:"type"`
	Datasource *dashDatasource `json:"datasource"`
	Targets    []struct {
		RefID      string          `json:"refId"`
		Expr       string          `json:"expr"`
		Datasource *dashDatasource `json:"datasource"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"`
}

// unknownMetrics lists "where: name" for every metric an expression names
// that keyway does not register.
func unknownMetrics(exprs map[string]string, reg registeredMetrics) (unknown []string, used map[string]bool) {
	used = map[string]bool{}
	for where, e := range exprs {
		for _, m := range exprMetric.FindAllString(e, -1) {
			used[m] = true
			if !reg.known(m) {
				unknown = append(unknown, where+": "+m)
			}
		}
	}
	sort.Strings(unknown)
	return unknown, used
}

func TestGrafanaDashboardUsesOnlyKeywayMetrics(t *testing.T) {
	slow.Skip(t)
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	reg := scrapeMetrics(t)
	scraped := len(reg.registered)
	for n := range describeMetrics(t) {
		if !reg.registered[n] {
			t.Logf("registered, no series in the scenario: %s", n)
		}
		reg.registered[n] = true
	}
	if scraped == 0 || !reg.registered["keyway_requests_total"] || reg.types["keyway_request_duration_seconds"] != "histogram" {
		t.Fatalf("the scrape found no keyway metrics: %v", reg.types)
	}

	exprs := dashboardExprs(t, raw)
	unknown, used := unknownMetrics(exprs, reg)
	for _, u := range unknown {
		t.Errorf("the dashboard names a metric keyway does not export: %s", u)
	}
	// The panels the issue asks for.
	for _, m := range []string{
		"keyway_requests_total", "keyway_request_duration_seconds_bucket", "keyway_rotation_replicas",
		"keyway_ring_replicas", "keyway_replica_set_phase", "keyway_ejections_total",
		"keyway_ring_moved_partitions_total", "keyway_table_rebuilds_total", "keyway_gossip_members",
		"keyway_ring_fingerprint_disagreements", "keyway_upstream_errors_total", "keyway_retries_total",
		"keyway_all_replicas_unhealthy_total", "keyway_replica_in_rotation", "keyway_replica_state",
		"keyway_gossip_health_score", "keyway_gossip_replicas", "keyway_config_reloads_total", "keyway_config_last_reload_successful",
		// The agents' row.
		"keyway_agent_info", "keyway_agent_state", "keyway_agent_probes_total", "keyway_agent_state_changes_total",
		"keyway_agent_child_starts_total", "keyway_agent_child_exits_total", "keyway_agent_child_restarts_total",
		"keyway_agent_child_gave_up_total", "keyway_agent_child_running", "keyway_agent_set_commands_total",
		"keyway_gossip_rejected_total",
	} {
		if !used[m] {
			t.Errorf("no panel uses %s", m)
		}
	}
	t.Logf("%d expressions, %d keyway metrics used, %d metric families known", len(exprs), len(used), len(reg.registered))

	// The check itself catches a made-up name and a _bucket of a counter.
	bad, _ := unknownMetrics(map[string]string{
		"a": `rate(keyway_requests_totl[5m])`,
		"b": `keyway_requests_total_bucket`,
	}, reg)
	if len(bad) != 2 {
		t.Errorf("the check missed a bad name: %v", bad)
	}
}
