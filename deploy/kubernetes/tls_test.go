package kubernetes_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"
)

// tlsOverlay is the kustomize overlay that turns TLS on.
const tlsOverlay = "../kubernetes-tls"

// TestTLSOverlay applies the TLS overlay's patches to the StatefulSet as
// kustomize does (a strategic merge), and checks the result: probes and
// the scrape annotation use HTTPS, and --tls-cert and --tls-key name the
// files of a mounted kubernetes.io/tls Secret. (kubectl kustomize renders
// the same; it is not needed here.)
func TestTLSOverlay(t *testing.T) {
	k := loadOverlay(t, tlsOverlay)
	if len(k.Resources) != 1 {
		t.Errorf("resources %v: want the base, ../kubernetes", k.Resources)
	}
	if len(k.Patches) == 0 {
		t.Fatal("no patches")
	}
	m := load(t)
	merged, err := json.Marshal(m.sts())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range k.Patches {
		doc, err := os.ReadFile(filepath.Join(tlsOverlay, p.Path))
		if err != nil {
			t.Fatal(err)
		}
		// Strictly, as the API server would decode the patched object: a
		// misspelt field in a patch fails here.
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
	var sts appsv1.StatefulSet
	if err := json.Unmarshal(merged, &sts); err != nil {
		t.Fatal(err)
	}
	checkTLS(t, "the patched StatefulSet", m.sts(), &sts)

}

func absPath(p string) string {
	a, _ := filepath.Abs(p)
	return a
}

// checkTLS checks a StatefulSet with TLS on against the base.
func checkTLS(t *testing.T, what string, base, sts *appsv1.StatefulSet) {
	t.Helper()
	tm := &manifests{statefulSets: []*appsv1.StatefulSet{sts}}
	c := tm.container(t)
	bc := (&manifests{statefulSets: []*appsv1.StatefulSet{base}}).container(t)
	flags := tm.containerFlags(t)
	src := sluiceSource(t)
	for name := range flags {
		if !strings.Contains(src, strconv.Quote(name)) {
			t.Errorf("%s passes --%s, which cmd/sluice does not define", what, name)
		}
	}
	for name, v := range (&manifests{statefulSets: []*appsv1.StatefulSet{base}}).containerFlags(t) {
		if flags[name] != v {
			t.Errorf("%s: --%s %q, the base has %q: the overlay should only add TLS", what, name, flags[name], v)
		}
	}
	for flag, key := range map[string]string{"tls-cert": corev1.TLSCertKey, "tls-key": corev1.TLSPrivateKeyKey} {
		file := requireFlag(t, flags, flag)
		vm, ok := mountFor(c, file)
		if !ok {
			t.Errorf("%s: --%s %s is on no volume mount", what, flag, file)
			continue
		}
		var vol *corev1.Volume
		for i := range sts.Spec.Template.Spec.Volumes {
			if v := &sts.Spec.Template.Spec.Volumes[i]; v.Name == vm.Name {
				vol = v
			}
		}
		if vol == nil || vol.Secret == nil {
			t.Errorf("%s: --%s %s: the volume %q is not a Secret", what, flag, file, vm.Name)
			continue
		}
		if want := filepath.Join(vm.MountPath, key); file != want {
			t.Errorf("%s: --%s %s, want %s (the key of a kubernetes.io/tls Secret)", what, flag, file, want)
		}
	}
	probes := map[string][2]*corev1.Probe{
		"startupProbe":   {bc.StartupProbe, c.StartupProbe},
		"livenessProbe":  {bc.LivenessProbe, c.LivenessProbe},
		"readinessProbe": {bc.ReadinessProbe, c.ReadinessProbe},
	}
	for name, p := range probes {
		b, got := p[0], p[1]
		if b == nil || got == nil || got.HTTPGet == nil {
			t.Errorf("%s: %s is missing or not httpGet", what, name)
			continue
		}
		if got.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("%s: %s scheme %q: with --tls-cert, HTTP is served over TLS only; want HTTPS", what, name, got.HTTPGet.Scheme)
		}
		if got.HTTPGet.Path != b.HTTPGet.Path || got.HTTPGet.Port != b.HTTPGet.Port || got.PeriodSeconds != b.PeriodSeconds || got.FailureThreshold != b.FailureThreshold {
			t.Errorf("%s: %s changed more than its scheme: %+v, base %+v", what, name, got, b)
		}
	}
	ann := sts.Spec.Template.Annotations
	if ann["prometheus.io/scheme"] != "https" {
		t.Errorf("%s: annotation prometheus.io/scheme %q, want https", what, ann["prometheus.io/scheme"])
	}
	for k, v := range base.Spec.Template.Annotations {
		if ann[k] != v {
			t.Errorf("%s: annotation %s %q, the base has %q", what, k, ann[k], v)
		}
	}
}
