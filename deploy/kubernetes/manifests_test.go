// Package kubernetes_test checks the manifests in this directory, the TLS
// overlay in ../kubernetes-tls, the cluster overlays in
// ../kubernetes-cluster (replicated shards) and ../kubernetes-sharded,
// the monitoring overlay in ../kubernetes-monitoring,
// and the Dockerfile at the root of the repository, against each other and
// against the flags of cmd/sluice. It needs no cluster and no network:
// every manifest is decoded strictly into the Kubernetes API types (the
// Prometheus Operator's ServiceMonitor into the part of it used here), so
// a misspelt field fails, and then the settings that must agree are
// compared.
package kubernetes_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// runtimeOverhead is the allowance of the sizing rule for the Go runtime,
// connections and the commit queue.
const runtimeOverhead = 64 << 20

// kustomization is the part of kustomize's Kustomization that these
// manifests use; decoding it strictly rejects any other field, so a field
// added here must be added to the struct too.
type kustomization struct {
	metav1.TypeMeta `json:",inline"`
	Resources       []string         `json:"resources"`
	Images          []kustomizeImage `json:"images,omitempty"`
	Patches         []kustomizePatch `json:"patches,omitempty"`
}

// kustomizePatch is a patch file of a kustomization.
type kustomizePatch struct {
	Path string `json:"path"`
}

type kustomizeImage struct {
	Name    string `json:"name"`
	NewName string `json:"newName,omitempty"`
	NewTag  string `json:"newTag,omitempty"`
	Digest  string `json:"digest,omitempty"`
}

// manifests is every object in this directory, by kind.
type manifests struct {
	statefulSets   []*appsv1.StatefulSet
	services       []*corev1.Service
	secrets        []*corev1.Secret
	budgets        []*policyv1.PodDisruptionBudget
	kustomizations []*kustomization
	cronJobs       []*batchv1.CronJob
	claims         []*corev1.PersistentVolumeClaim
}

// add decodes one YAML document strictly into the type its apiVersion and
// kind name.
func (m *manifests) add(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	var err error
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 StatefulSet":
		m.statefulSets, err = appendStrict(m.statefulSets, doc)
	case "v1 Service":
		m.services, err = appendStrict(m.services, doc)
	case "v1 Secret":
		m.secrets, err = appendStrict(m.secrets, doc)
	case "policy/v1 PodDisruptionBudget":
		m.budgets, err = appendStrict(m.budgets, doc)
	case "kustomize.config.k8s.io/v1beta1 Kustomization":
		m.kustomizations, err = appendStrict(m.kustomizations, doc)
	case "batch/v1 CronJob":
		m.cronJobs, err = appendStrict(m.cronJobs, doc)
	case "v1 PersistentVolumeClaim":
		m.claims, err = appendStrict(m.claims, doc)
	default:
		return fmt.Errorf("unknown apiVersion %q kind %q: teach manifests_test.go about it", tm.APIVersion, tm.Kind)
	}
	return err
}

// appendStrict decodes doc as the API server does: field names are case
// sensitive (encoding/json, and so yaml.UnmarshalStrict, would take
// "clusterIp" for "clusterIP"), and unknown or repeated fields are errors.
func appendStrict[T any](list []*T, doc []byte) ([]*T, error) {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return list, err
	}
	obj := new(T)
	strictErrs, err := kjson.UnmarshalStrict(j, obj)
	if err = errors.Join(append(strictErrs, err)...); err != nil {
		return list, err
	}
	return append(list, obj), nil
}

// addFile decodes every document of a multi-document YAML stream.
func (m *manifests) addFile(r io.Reader) error {
	yr := utilyaml.NewYAMLReader(bufio.NewReader(r))
	for i := 1; ; i++ {
		doc, err := yr.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if j, err := yaml.YAMLToJSON(doc); err != nil {
			return fmt.Errorf("document %d: %w", i, err)
		} else if string(bytes.TrimSpace(j)) == "null" {
			continue // only comments
		}
		if err := m.add(doc); err != nil {
			return fmt.Errorf("document %d: %w", i, err)
		}
	}
}

// load reads every *.yaml file in this directory and expects one object of
// each kind.
func load(t *testing.T) *manifests {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	m := new(manifests)
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		err = m.addFile(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	for kind, n := range map[string]int{
		"StatefulSet":           len(m.statefulSets),
		"Service":               len(m.services),
		"Secret":                len(m.secrets),
		"PodDisruptionBudget":   len(m.budgets),
		"Kustomization":         len(m.kustomizations),
		"CronJob":               len(m.cronJobs),
		"PersistentVolumeClaim": len(m.claims),
	} {
		if n != 1 {
			t.Fatalf("want one %s, have %d", kind, n)
		}
	}
	return m
}

func (m *manifests) sts() *appsv1.StatefulSet { return m.statefulSets[0] }

// container is the sluice container of the StatefulSet.
func (m *manifests) container(t *testing.T) *corev1.Container {
	t.Helper()
	cs := m.sts().Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("want one container, have %d", len(cs))
	}
	return &cs[0]
}

// containerFlags is the flags the container runs with: SLUICE_* variables,
// then the arguments over them, as cmd/sluice reads them.
func (m *manifests) containerFlags(t *testing.T) map[string]string {
	t.Helper()
	c := m.container(t)
	if len(c.Command) != 0 {
		t.Errorf("command %q replaces the image's entrypoint; set args only", c.Command)
	}
	flags := map[string]string{}
	for _, e := range c.Env {
		if name, ok := strings.CutPrefix(e.Name, "SLUICE_"); ok {
			if e.ValueFrom != nil {
				t.Errorf("env %s: valueFrom cannot be checked here; use a flag or a file", e.Name)
			}
			flags[strings.ReplaceAll(strings.ToLower(name), "_", "-")] = e.Value
		}
	}
	maps.Copy(flags, parseFlags(t, c.Args))
	return flags
}

// parseFlags reads --name=value and --name value, as the flag package does;
// every flag the manifests pass takes a value.
func parseFlags(t *testing.T, args []string) map[string]string {
	t.Helper()
	flags := map[string]string{}
	for i := 0; i < len(args); i++ {
		name, ok := strings.CutPrefix(args[i], "-")
		if !ok {
			t.Errorf("argument %q is not a flag", args[i])
			continue
		}
		name = strings.TrimPrefix(name, "-")
		name, value, hasValue := strings.Cut(name, "=")
		if !hasValue {
			if i+1 == len(args) {
				t.Errorf("flag --%s has no value", name)
				continue
			}
			i++
			value = args[i]
		}
		if _, dup := flags[name]; dup {
			t.Errorf("flag --%s is given twice", name)
		}
		flags[name] = value
	}
	return flags
}

// requireFlag returns a flag the manifests must set explicitly.
func requireFlag(t *testing.T, flags map[string]string, name string) string {
	t.Helper()
	v, ok := flags[name]
	if !ok {
		t.Fatalf("--%s is not set; set it explicitly", name)
	}
	return v
}

// parseBytes reads sluice's sizes (64MiB, 100MB, 512) and GOMEMLIMIT's
// (340MiB, 1GiB) by mapping their suffixes onto Kubernetes quantities.
func parseBytes(t *testing.T, s string) int64 {
	t.Helper()
	q := s
	for _, u := range []struct{ from, to string }{
		{"KiB", "Ki"}, {"MiB", "Mi"}, {"GiB", "Gi"}, {"TiB", "Ti"},
		{"KB", "k"}, {"MB", "M"}, {"GB", "G"}, {"B", ""},
	} {
		if strings.HasSuffix(q, u.from) {
			q = strings.TrimSuffix(q, u.from) + u.to
			break
		}
	}
	v, err := resource.ParseQuantity(q)
	n, exact := v.AsInt64()
	if err != nil || !exact || n < 0 || strings.ContainsAny(q, ".eE") {
		t.Fatalf("%q is not a size", s)
	}
	return n
}

// port is the port of a listen address that must accept connections from
// outside the pod (probes, clients, Prometheus).
func port(t *testing.T, flag, addr string) int32 {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("--%s %q: %v", flag, addr, err)
	}
	if host != "" && host != "0.0.0.0" && host != "::" {
		t.Errorf("--%s %q listens on %s only; probes and clients come from outside the pod", flag, addr, host)
	}
	n, err := strconv.ParseInt(p, 10, 32)
	if err != nil {
		t.Fatalf("--%s %q: port: %v", flag, addr, err)
	}
	return int32(n)
}

// containerPort resolves a named or numbered port of the container.
func containerPort(c *corev1.Container, p intstr.IntOrString) (int32, bool) {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// mountFor is the volume mount that holds path.
func mountFor(c *corev1.Container, path string) (corev1.VolumeMount, bool) {
	for _, vm := range c.VolumeMounts {
		if path == vm.MountPath || strings.HasPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/") {
			return vm, true
		}
	}
	return corev1.VolumeMount{}, false
}

// selects reports whether every label of the selector is on the pod.
func selects(selector, podLabels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if podLabels[k] != v {
			return false
		}
	}
	return true
}

func TestDecodeIsStrict(t *testing.T) {
	for name, doc := range map[string]string{
		"misspelt field":  "apiVersion: v1\nkind: Service\nspec:\n  selectr: {}\n",
		"field case":      "apiVersion: v1\nkind: Service\nspec:\n  clusterIp: None\n",
		"duplicate field": "apiVersion: v1\nkind: Service\nspec:\n  clusterIP: None\n  clusterIP: None\n",
		"wrong type":      "apiVersion: apps/v1\nkind: StatefulSet\nspec:\n  replicas: one\n",
		"unknown kind":    "apiVersion: v1\nkind: ConfigMap\ndata: {}\n",
		"wrong version":   "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget\n",
	} {
		var m manifests
		if err := m.addFile(strings.NewReader(doc)); err == nil {
			t.Errorf("%s: decoded without an error:\n%s", name, doc)
		}
	}
	var m manifests
	if err := m.addFile(strings.NewReader("# comment\n---\napiVersion: v1\nkind: Service\n---\n")); err != nil || len(m.services) != 1 {
		t.Errorf("multi-document stream: %v, %d services", err, len(m.services))
	}
}

func TestStatefulSet(t *testing.T) {
	m := load(t)
	sts := m.sts()
	pod := sts.Spec.Template
	c := m.container(t)
	flags := m.containerFlags(t)

	if sts.Spec.Selector == nil || !selects(sts.Spec.Selector.MatchLabels, pod.Labels) || len(sts.Spec.Selector.MatchExpressions) != 0 {
		t.Errorf("selector: want matchLabels that select the pod labels %v", pod.Labels)
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 1 {
		t.Errorf("replicas: want 1 by default (each replica is an independent store)")
	}

	// Ports and probes.
	respPort := port(t, "addr", requireFlag(t, flags, "addr"))
	httpPort := port(t, "http-addr", requireFlag(t, flags, "http-addr"))
	for name, want := range map[string]int32{"resp": respPort, "http": httpPort} {
		if got, ok := containerPort(c, intstr.FromString(name)); !ok || got != want {
			t.Errorf("container port %q = %d, want %d from the flags", name, got, want)
		}
	}
	probes := map[string]struct {
		probe *corev1.Probe
		path  string
	}{
		"startupProbe":   {c.StartupProbe, "/healthz"},
		"livenessProbe":  {c.LivenessProbe, "/healthz"},
		"readinessProbe": {c.ReadinessProbe, "/readyz"},
	}
	for name, p := range probes {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe on %s", name, p.path)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s path %q, want %q", name, p.probe.HTTPGet.Path, p.path)
		}
		if got, ok := containerPort(c, p.probe.HTTPGet.Port); !ok || got != httpPort {
			t.Errorf("%s port %v is not the HTTP port %d", name, p.probe.HTTPGet.Port.String(), httpPort)
		}
	}
	if pod.Annotations["prometheus.io/port"] != strconv.Itoa(int(httpPort)) || pod.Annotations["prometheus.io/path"] != "/metrics" {
		t.Errorf("prometheus annotations %v: want port %d, path /metrics", pod.Annotations, httpPort)
	}

	// Storage: --data is on the volume claim, backups are on it too.
	data := requireFlag(t, flags, "data")
	dataMount, ok := mountFor(c, data)
	if !ok || dataMount.ReadOnly {
		t.Errorf("--data %s is not on a writable volume", data)
	} else if !slices.ContainsFunc(sts.Spec.VolumeClaimTemplates, func(pvc corev1.PersistentVolumeClaim) bool { return pvc.Name == dataMount.Name }) {
		t.Errorf("the data mount %q is not a volumeClaimTemplate", dataMount.Name)
	} else {
		checkVolumeLayout(t, "the StatefulSet", flags, dataMount.MountPath)
	}
	backups := requireFlag(t, flags, "backup-dir")
	if vm, ok := mountFor(c, backups); !ok || vm.ReadOnly {
		t.Errorf("--backup-dir %s is not on a writable volume (the root filesystem is read-only)", backups)
	} else if vm.Name != dataMount.Name {
		t.Errorf("--backup-dir %s is not on the data volume: CHECKPOINT hard-links the store's files", backups)
	}

	// Authentication: protected mode with a password from the Secret.
	if v := requireFlag(t, flags, "protected-mode"); v != "yes" {
		t.Errorf("--protected-mode %s, want yes", v)
	}
	passFile := requireFlag(t, flags, "requirepass-file")
	if _, ok := flags["requirepass"]; ok {
		t.Errorf("--requirepass puts the password in the pod spec; use --requirepass-file")
	}
	vm, ok := mountFor(c, passFile)
	if !ok {
		t.Fatalf("--requirepass-file %s is not on a volume", passFile)
	}
	i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
	if i < 0 {
		t.Fatalf("volume %q is not defined", vm.Name)
	}
	vol, secret := pod.Spec.Volumes[i], m.secrets[0]
	if vol.Secret == nil || vol.Secret.SecretName != secret.Name {
		t.Fatalf("--requirepass-file %s: volume %q is not the Secret %q", passFile, vm.Name, secret.Name)
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(passFile, vm.MountPath), "/")
	key := ""
	for _, it := range vol.Secret.Items {
		if it.Path == rel {
			key = it.Key
		}
	}
	if key == "" {
		t.Errorf("--requirepass-file %s: no item of Secret %s has path %q", passFile, secret.Name, rel)
	} else if _, ok := secret.StringData[key]; !ok {
		t.Errorf("--requirepass-file %s: secret.example.yaml has no key %q", passFile, key)
	}
	if mode := vol.Secret.DefaultMode; mode == nil || *mode != 0o440 {
		t.Errorf("secret defaultMode: want 0440, readable by the owner and the fsGroup only")
	}

	// Shutdown: the kubelet's SIGKILL comes after the server's own timeout.
	shutdown, err := time.ParseDuration(requireFlag(t, flags, "shutdown-timeout"))
	if err != nil {
		t.Fatalf("--shutdown-timeout: %v", err)
	}
	grace := pod.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= shutdown+5*time.Second {
		t.Errorf("terminationGracePeriodSeconds: want more than --shutdown-timeout %v plus 5s to close the store", shutdown)
	}

	if pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks {
		t.Errorf("enableServiceLinks: want false, or a Service named sluice injects SLUICE_* variables that sluice reads as flags")
	}
}

func TestSecurityContext(t *testing.T) {
	m := load(t)
	ps := m.sts().Spec.Template.Spec.SecurityContext
	cs := m.container(t).SecurityContext
	if ps == nil || cs == nil {
		t.Fatal("want a pod and a container securityContext")
	}
	// A container setting wins over the pod's.
	runAsNonRoot, runAsUser := ps.RunAsNonRoot, ps.RunAsUser
	if cs.RunAsNonRoot != nil {
		runAsNonRoot = cs.RunAsNonRoot
	}
	if cs.RunAsUser != nil {
		runAsUser = cs.RunAsUser
	}
	if runAsNonRoot == nil || !*runAsNonRoot {
		t.Error("runAsNonRoot: want true")
	}
	if runAsUser == nil || *runAsUser != 65532 {
		t.Error("runAsUser: want 65532, the image's user")
	}
	if ps.FSGroup == nil || *ps.FSGroup != 65532 {
		t.Error("fsGroup: want 65532 so that the volume is writable")
	}
	if cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem: want true")
	}
	if cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation: want false")
	}
	if cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(cs.Capabilities.Add) != 0 {
		t.Errorf("capabilities %v: want drop ALL, add none", cs.Capabilities)
	}
	seccomp := ps.SeccompProfile
	if cs.SeccompProfile != nil {
		seccomp = cs.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccompProfile %v: want RuntimeDefault", seccomp)
	}
}

// TestMemory checks the sizing rule of docs/operations.md ("Sizing"): RSS ≈ cache-size +
// 2 × memtable-size + cache-memory + key-filter-size + 64 MiB.
func TestMemory(t *testing.T) {
	m := load(t)
	c := m.container(t)
	flags := m.containerFlags(t)
	need := parseBytes(t, requireFlag(t, flags, "cache-size")) +
		2*parseBytes(t, requireFlag(t, flags, "memtable-size")) +
		parseBytes(t, requireFlag(t, flags, "cache-memory")) +
		parseBytes(t, requireFlag(t, flags, "key-filter-size")) +
		runtimeOverhead

	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		t.Fatal("no memory limit")
	}
	if limit.Value() < need {
		t.Errorf("memory limit %s (%d MiB) is below the sizing rule: %d MiB", limit.String(), limit.Value()>>20, need>>20)
	}
	if req, ok := c.Resources.Requests[corev1.ResourceMemory]; !ok || req.Value() < need {
		t.Errorf("memory request %s is below the sizing rule: %d MiB", req.String(), need>>20)
	}
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			if g := parseBytes(t, e.Value); g < need || g >= limit.Value() {
				t.Errorf("GOMEMLIMIT %s: want between the sizing rule (%d MiB) and the limit (%s)", e.Value, need>>20, limit.String())
			}
		}
	}
}

func TestService(t *testing.T) {
	m := load(t)
	svc, sts := m.services[0], m.sts()
	c := m.container(t)
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("clusterIP %q: want None (headless)", svc.Spec.ClusterIP)
	}
	if !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("publishNotReadyAddresses: want true, so that sluice-0.sluice keeps resolving while /readyz is 503 and clients get sluice's configured replies rather than a lookup failure")
	}
	if sts.Spec.ServiceName != svc.Name {
		t.Errorf("serviceName %q is not the headless Service %q", sts.Spec.ServiceName, svc.Name)
	}
	if !selects(svc.Spec.Selector, sts.Spec.Template.Labels) {
		t.Errorf("selector %v does not select the pod labels %v", svc.Spec.Selector, sts.Spec.Template.Labels)
	}
	names := map[string]bool{}
	for _, p := range svc.Spec.Ports {
		names[p.Name] = true
		got, ok := containerPort(c, p.TargetPort)
		if !ok {
			t.Errorf("port %q: targetPort %s is not a container port", p.Name, p.TargetPort.String())
		} else if got != p.Port {
			t.Errorf("port %q: %d forwards to %d; keep them equal, clients use the pod's DNS name", p.Name, p.Port, got)
		}
	}
	if !names["resp"] || !names["http"] {
		t.Errorf("ports %v: want resp and http", svc.Spec.Ports)
	}
}

func TestPodDisruptionBudget(t *testing.T) {
	m := load(t)
	pdb, sts := m.budgets[0], m.sts()
	if pdb.Spec.Selector == nil || !selects(pdb.Spec.Selector.MatchLabels, sts.Spec.Template.Labels) {
		t.Errorf("selector: want matchLabels that select the pod labels %v", sts.Spec.Template.Labels)
	}
	if (pdb.Spec.MaxUnavailable == nil) == (pdb.Spec.MinAvailable == nil) {
		t.Fatal("want exactly one of maxUnavailable and minAvailable")
	}
	replicas := 1 // the API's default
	if sts.Spec.Replicas != nil {
		replicas = int(*sts.Spec.Replicas)
	}
	allowed := 0
	if pdb.Spec.MaxUnavailable != nil {
		n, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MaxUnavailable, replicas, true)
		if err != nil {
			t.Fatal(err)
		}
		allowed = n
	} else {
		n, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MinAvailable, replicas, true)
		if err != nil {
			t.Fatal(err)
		}
		allowed = replicas - n
	}
	if allowed < 1 {
		t.Errorf("with %d replicas the budget allows no eviction, so node drains hang", replicas)
	}
}

func TestKustomization(t *testing.T) {
	m := load(t)
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range files {
		if f != "kustomization.yaml" && !strings.HasSuffix(f, ".example.yaml") {
			want = append(want, f)
		}
	}
	got := slices.Sorted(slices.Values(m.kustomizations[0].Resources))
	if !slices.Equal(got, want) {
		t.Errorf("resources %v, want every manifest but examples: %v", got, want)
	}
	image := m.container(t).Image
	if !slices.ContainsFunc(m.kustomizations[0].Images, func(i kustomizeImage) bool { return i.Name == image }) {
		t.Errorf("no images entry for the container image %q", image)
	}
}

func TestSecretExample(t *testing.T) {
	m := load(t)
	s := m.secrets[0]
	if len(s.Data) != 0 {
		t.Errorf("the example sets data; use stringData with a placeholder")
	}
	for k, v := range s.StringData {
		if !strings.Contains(v, "REPLACE") {
			t.Errorf("stringData.%s = %q does not look like a placeholder", k, v)
		}
	}
}

// TestFlagsExist checks that every flag the container passes is defined by
// cmd/sluice.
func TestFlagsExist(t *testing.T) {
	m := load(t)
	src := sluiceSource(t)
	for name := range m.containerFlags(t) {
		if !strings.Contains(src, strconv.Quote(name)) {
			t.Errorf("statefulset.yaml passes --%s, which cmd/sluice does not define", name)
		}
	}
}

// sluiceSource is the non-test Go source of cmd/sluice, where the flags are
// defined.
func sluiceSource(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "cmd", "sluice", "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no cmd/sluice sources: %v", err)
	}
	var b strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(src)
	}
	return b.String()
}

// hasSubcommand reports whether cmd/sluice's source src dispatches the
// subcommand name: an entry of its table of subcommands (main.go's
// commands), `"name": nameCommand{},`.
func hasSubcommand(src, name string) bool {
	entry := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(strconv.Quote(name)) + `:\s*[a-z][A-Za-z]*Command\{\},$`)
	return name != "" && entry.MatchString(src)
}

// loadOverlay reads the kustomization of the overlay in dir, and checks
// that its first resource is this base.
func loadOverlay(t *testing.T, dir string) *kustomization {
	t.Helper()
	return loadOverlayOf(t, dir, ".")
}

// loadOverlayOf reads the kustomization of the overlay in dir, and checks
// that its first resource is the overlay or base in of.
func loadOverlayOf(t *testing.T, dir, of string) *kustomization {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var o manifests
	if err := o.add(raw); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	k := o.kustomizations[0]
	want, _ := filepath.Abs(of)
	if len(k.Resources) == 0 || absPath(filepath.Join(dir, k.Resources[0])) != want {
		t.Errorf("%s: resources %v: want %s first", dir, k.Resources, of)
	}
	return k
}

// repoRoot is the root of the repository, relative to this package.
const repoRoot = "../.."
