package kubernetes_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"
)

// clusterOverlay is the kustomize overlay that runs the pods in cluster
// mode with replicated shards, and shardedOverlay the one with one copy
// of each slot.
const (
	clusterOverlay = "../kubernetes-cluster"
	shardedOverlay = "../kubernetes-sharded"
)

// overlayStatefulSet applies the patches of the overlay in dir to the
// base StatefulSet as kustomize does (a strategic merge).
func overlayStatefulSet(t *testing.T, dir string, base *appsv1.StatefulSet) *appsv1.StatefulSet {
	t.Helper()
	return patchedStatefulSet(t, dir, loadOverlay(t, dir), base)
}

// patchedStatefulSet applies the patches of k, the overlay in dir, to sts
// as kustomize does (a strategic merge).
func patchedStatefulSet(t *testing.T, dir string, k *kustomization, sts *appsv1.StatefulSet) *appsv1.StatefulSet {
	t.Helper()
	if len(k.Resources) != 1 {
		t.Errorf("%s: resources %v: want one, the overlay or base it patches", dir, k.Resources)
	}
	if len(k.Patches) == 0 {
		t.Fatalf("%s: no patches", dir)
	}
	merged, err := json.Marshal(sts)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range k.Patches {
		doc, err := os.ReadFile(filepath.Join(dir, p.Path))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := appendStrict([]*appsv1.StatefulSet(nil), doc); err != nil {
			t.Fatalf("%s: %v", p.Path, err)
		}
		patch, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatal(err)
		}
		if merged, err = strategicpatch.StrategicMergePatch(merged, patch, appsv1.StatefulSet{}); err != nil {
			t.Fatalf("%s: %v", p.Path, err)
		}
	}
	var out appsv1.StatefulSet
	if err := json.Unmarshal(merged, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// checkNodesTemplate checks a --cluster-nodes (or --nodes) template: the
// StatefulSet's pods by the headless Service's names, in the pod's own
// namespace, on the RESP port.
func checkNodesTemplate(t *testing.T, what, tmpl string, sts *appsv1.StatefulSet, svcName string, respPort int32) {
	t.Helper()
	want := sts.Name + "-{i}." + svcName + ".$(POD_NAMESPACE).svc:" + strconv.Itoa(int(respPort))
	if tmpl != want {
		t.Errorf("%s %q, want %q: the pods' stable names in the headless Service, on the RESP port", what, tmpl, want)
	}
}

// checkNamespaceEnv checks that env defines POD_NAMESPACE from the
// downward API before any variable that refers to it.
func checkNamespaceEnv(t *testing.T, what string, env []corev1.EnvVar) {
	t.Helper()
	i := slices.IndexFunc(env, func(e corev1.EnvVar) bool { return e.Name == "POD_NAMESPACE" })
	if i < 0 || env[i].ValueFrom == nil || env[i].ValueFrom.FieldRef == nil || env[i].ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Fatalf("%s: want POD_NAMESPACE from fieldRef metadata.namespace", what)
	}
	for j, e := range env {
		if strings.Contains(e.Value, "$(POD_NAMESPACE)") && j < i {
			t.Errorf("%s: %s refers to POD_NAMESPACE, defined after it (Kubernetes expands only earlier variables)", what, e.Name)
		}
	}
}

// TestClusterOverlays checks both cluster overlays: the flags exist and
// the base's are kept, --cluster-nodes names every pod by its stable DNS
// name on the RESP port, --cluster-size is the replica count, the pod's
// ordinal comes from its hostname, and the Service and the
// PodDisruptionBudget suit a cluster (names resolve while a pod is not
// ready; one shard down at a time).
func TestClusterOverlays(t *testing.T) {
	for _, dir := range []string{clusterOverlay, shardedOverlay} {
		t.Run(filepath.Base(dir), func(t *testing.T) { testClusterOverlay(t, dir) })
	}
}

func testClusterOverlay(t *testing.T, dir string) {
	m := load(t)
	base := m.sts()
	sts := overlayStatefulSet(t, dir, base)
	tm := &manifests{statefulSets: []*appsv1.StatefulSet{sts}}
	c := tm.container(t)
	flags := tm.containerFlags(t)
	src := sluiceSource(t)
	for name := range flags {
		if !strings.Contains(src, strconv.Quote(name)) {
			t.Errorf("the cluster overlay passes --%s, which cmd/sluice does not define", name)
		}
	}
	for name, v := range m.containerFlags(t) {
		if flags[name] != v {
			t.Errorf("--%s %q, the base has %q: the overlay should only add cluster mode", name, flags[name], v)
		}
	}
	respPort := port(t, "addr", requireFlag(t, flags, "addr"))
	checkNodesTemplate(t, "--cluster-nodes", requireFlag(t, flags, "cluster-nodes"), sts, m.services[0].Name, respPort)
	size, err := strconv.Atoi(requireFlag(t, flags, "cluster-size"))
	if err != nil || sts.Spec.Replicas == nil || int(*sts.Spec.Replicas) != size || size < 3 {
		replicas := "unset"
		if sts.Spec.Replicas != nil {
			replicas = strconv.Itoa(int(*sts.Spec.Replicas))
		}
		t.Errorf("--cluster-size %v and replicas %s: want the same, at least 3", flags["cluster-size"], replicas)
	}
	if _, ok := flags["cluster-ordinal"]; ok {
		t.Errorf("--cluster-ordinal is set: each pod takes its ordinal from its hostname")
	}
	checkNamespaceEnv(t, "the StatefulSet", c.Env)
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q: want Parallel, the nodes do not wait for each other", sts.Spec.PodManagementPolicy)
	}
	if !m.services[0].Spec.PublishNotReadyAddresses || m.services[0].Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("the Service must be headless and publish not-ready pods: the announced names must resolve")
	}
	if pdb := m.budgets[0]; pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget: want maxUnavailable 1, one shard's slots down at a time")
	}
}

// TestRebalanceJob checks the rebalance examples against their
// overlays, and TestAddNodeJob and TestRemoveNodeJob the add-node and
// remove-node examples against the replicated one: the same image,
// sluice cluster over the same pods' names, the password from the same
// Secret.
func TestRebalanceJob(t *testing.T) {
	checkToolJob(t, shardedOverlay, "rebalance-job.example.yaml", "rebalance")
	checkToolJob(t, clusterOverlay, "rebalance-job.example.yaml", "rebalance")
}

func TestAddNodeJob(t *testing.T) {
	flags := checkToolJob(t, clusterOverlay, "add-node-job.example.yaml", "add-node")
	if want := firstPodPast(t); flags["add"] != want {
		t.Errorf("--add %q: want %q, the first pod past --cluster-size", flags["add"], want)
	}
}

func TestRemoveNodeJob(t *testing.T) {
	flags := checkToolJob(t, clusterOverlay, "remove-node-job.example.yaml", "remove-node")
	if want := firstPodPast(t); flags["remove"] != want {
		t.Errorf("--remove %q: want %q, the pod the add-node example adds", flags["remove"], want)
	}
}

// firstPodPast is the announced address of the replicated overlay's
// first pod past its --cluster-size.
func firstPodPast(t *testing.T) string {
	t.Helper()
	m := load(t)
	sts := overlayStatefulSet(t, clusterOverlay, m.sts())
	tm := &manifests{statefulSets: []*appsv1.StatefulSet{sts}}
	stsFlags := tm.containerFlags(t)
	size, _ := strconv.Atoi(stsFlags["cluster-size"])
	return strings.ReplaceAll(stsFlags["cluster-nodes"], "{i}", strconv.Itoa(size))
}

// checkToolJob checks the Job in file of the overlay in dir, which runs
// sluice cluster sub, and returns its flags.
func checkToolJob(t *testing.T, dir, file, sub string) map[string]string {
	t.Helper()
	m := load(t)
	sts := overlayStatefulSet(t, dir, m.sts())
	raw, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := appendStrict([]*batchv1.Job(nil), raw)
	if err != nil {
		t.Fatal(err)
	}
	pod := jobs[0].Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, have %d", len(pod.Containers))
	}
	c := &pod.Containers[0]
	if want := sts.Spec.Template.Spec.Containers[0].Image; c.Image != want {
		t.Errorf("image %q, the StatefulSet's %q", c.Image, want)
	}
	if len(c.Command) != 0 || len(c.Args) < 2 || c.Args[0] != "cluster" || c.Args[1] != sub {
		t.Fatalf("args %q: want the image's entrypoint with cluster %s", c.Args, sub)
	}
	flags := parseFlags(t, c.Args[2:])
	src := sluiceSource(t)
	for name := range flags {
		if !strings.Contains(src, strconv.Quote(name)) {
			t.Errorf("the Job passes --%s, which cmd/sluice does not define", name)
		}
	}
	tm := &manifests{statefulSets: []*appsv1.StatefulSet{sts}}
	stsFlags := tm.containerFlags(t)
	if flags["nodes"] != stsFlags["cluster-nodes"] {
		t.Errorf("--nodes %q, the StatefulSet's --cluster-nodes %q: the same pods", flags["nodes"], stsFlags["cluster-nodes"])
	}
	if flags["cluster-size"] != stsFlags["cluster-size"] {
		t.Errorf("--cluster-size %q, the StatefulSet's %q", flags["cluster-size"], stsFlags["cluster-size"])
	}
	checkNamespaceEnv(t, "the Job", c.Env)
	if flags["requirepass-file"] != stsFlags["requirepass-file"] {
		t.Errorf("--requirepass-file %q, the StatefulSet's %q", flags["requirepass-file"], stsFlags["requirepass-file"])
	}
	vm, ok := mountFor(c, flags["requirepass-file"])
	if !ok {
		t.Fatalf("--requirepass-file is on no volume")
	}
	i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
	if i < 0 || pod.Volumes[i].Secret == nil || pod.Volumes[i].Secret.SecretName != m.secrets[0].Name {
		t.Errorf("the password volume is not the Secret %s", m.secrets[0].Name)
	}
	if pod.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy %q: want Never (the Job's backoffLimit retries a failed run)", pod.RestartPolicy)
	}
	if cs := c.SecurityContext; cs == nil || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem || cs.RunAsNonRoot == nil || !*cs.RunAsNonRoot {
		t.Errorf("securityContext: want non-root and a read-only root filesystem, as the server's")
	}
	return flags
}

// TestReplicatedClusterOverlay checks what the cluster overlay adds for
// replicated shards: --cluster-replicas 3 on 3 pods (each shard on every
// pod), the pods kept on distinct machines (a shard's replicas must not
// fail together), one pod down at a time, and the replication port
// declared where the nodes look for it (the RESP port plus 10000). The
// sharded overlay has none of it.
func TestReplicatedClusterOverlay(t *testing.T) {
	m := load(t)
	if flags := (&manifests{statefulSets: []*appsv1.StatefulSet{overlayStatefulSet(t, shardedOverlay, m.sts())}}).containerFlags(t); flags["cluster-replicas"] != "" {
		t.Errorf("the sharded overlay passes --cluster-replicas %s", flags["cluster-replicas"])
	}
	sts := overlayStatefulSet(t, clusterOverlay, m.sts())
	tm := &manifests{statefulSets: []*appsv1.StatefulSet{sts}}
	flags := tm.containerFlags(t)
	src := sluiceSource(t)
	for name := range flags {
		if !strings.Contains(src, strconv.Quote(name)) {
			t.Errorf("the cluster overlay passes --%s, which cmd/sluice does not define", name)
		}
	}
	replicas := requireFlag(t, flags, "cluster-replicas")
	if replicas != "3" || sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 || requireFlag(t, flags, "cluster-size") != "3" {
		t.Errorf("--cluster-replicas %s, --cluster-size %s, %v pods: want 3, 3 and 3", replicas, flags["cluster-size"], sts.Spec.Replicas)
	}
	if _, ok := flags["cluster-bus-nodes"]; ok {
		t.Errorf("--cluster-bus-nodes is set: the port below assumes the default, the RESP port plus 10000")
	}
	aff := sts.Spec.Template.Spec.Affinity
	spread := false
	if aff != nil && aff.PodAntiAffinity != nil {
		for _, term := range aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			sel := term.LabelSelector
			spread = spread || term.TopologyKey == "kubernetes.io/hostname" && sel != nil &&
				sel.MatchLabels["app.kubernetes.io/name"] == sts.Spec.Template.Labels["app.kubernetes.io/name"] && sel.MatchLabels["app.kubernetes.io/name"] != ""
		}
	}
	if !spread {
		t.Errorf("no required pod anti-affinity on kubernetes.io/hostname for the pods' own label: two replicas of a shard could share a machine")
	}
	c := tm.container(t)
	respPort := port(t, "addr", requireFlag(t, flags, "addr"))
	found := false
	for _, p := range c.Ports {
		found = found || p.Name == "replication" && p.ContainerPort == respPort+10000
	}
	if !found {
		t.Errorf("ports %v: want replication on %d, the RESP port plus 10000", c.Ports, respPort+10000)
	}
	if pdb := m.budgets[0]; pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget: want maxUnavailable 1, which a shard of 3 replicas survives")
	}
}
