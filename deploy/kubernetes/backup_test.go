package kubernetes_test

import (
	"net"
	"strconv"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestBackupCronJob checks the backup example against the StatefulSet and
// the Service: it runs sluice backup from the same image as the same user,
// reaches sluice-0 through the headless Service on the HTTP port, reads
// the password from the same Secret, and unpacks into a claim of its own.
func TestBackupCronJob(t *testing.T) {
	m := load(t)
	cj, sts, svc := m.cronJobs[0], m.sts(), m.services[0]
	if cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Errorf("concurrencyPolicy %q: want Forbid, so that a slow backup is not doubled", cj.Spec.ConcurrencyPolicy)
	}
	pod := cj.Spec.JobTemplate.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, have %d", len(pod.Containers))
	}
	c := &pod.Containers[0]
	if want := m.container(t).Image; c.Image != want {
		t.Errorf("image %q, the StatefulSet's %q: sluice backup must come with the server", c.Image, want)
	}
	if len(c.Command) != 0 {
		t.Errorf("command %q replaces the image's entrypoint; set args only", c.Command)
	}
	src := sluiceSource(t)
	if len(c.Args) == 0 || !hasSubcommand(src, c.Args[0]) {
		t.Fatalf("args %q: want a subcommand of cmd/sluice first", c.Args)
	}
	flags := parseFlags(t, c.Args[1:])
	for name := range flags {
		if !strings.Contains(src, strconv.Quote(name)) {
			t.Errorf("the CronJob passes --%s, which cmd/sluice does not define", name)
		}
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "SLUICE_") {
			t.Errorf("env %s: pass flags as args, which this test checks", e.Name)
		}
	}

	host, port, err := net.SplitHostPort(requireFlag(t, flags, "from"))
	if err != nil {
		t.Fatalf("--from: %v", err)
	}
	if want := sts.Name + "-0." + svc.Name; host != want {
		t.Errorf("--from host %q: want the first pod's name in the headless Service, %q", host, want)
	}
	var httpPort int32
	for _, p := range svc.Spec.Ports {
		if p.Name == "http" {
			httpPort = p.Port
		}
	}
	if port != strconv.Itoa(int(httpPort)) {
		t.Errorf("--from port %s: want the Service's http port %d (GET /backup is served there)", port, httpPort)
	}

	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	stsVolumes := map[string]corev1.Volume{}
	for _, v := range sts.Spec.Template.Spec.Volumes {
		stsVolumes[v.Name] = v
	}
	pw := requireFlag(t, flags, "requirepass-file")
	if want := m.containerFlags(t)["requirepass-file"]; pw != want {
		t.Errorf("--requirepass-file %s, the server's %s", pw, want)
	}
	if vm, ok := mountFor(c, pw); !ok || volumes[vm.Name].Secret == nil {
		t.Errorf("--requirepass-file %s is not on a Secret volume", pw)
	} else if svm, _ := mountFor(m.container(t), pw); stsVolumes[svm.Name].Secret == nil || volumes[vm.Name].Secret.SecretName != stsVolumes[svm.Name].Secret.SecretName {
		t.Errorf("--requirepass-file %s: the Secret %q is not the server's", pw, volumes[vm.Name].Secret.SecretName)
	}
	dir := requireFlag(t, flags, "dir")
	if vm, ok := mountFor(c, dir); !ok || vm.ReadOnly || volumes[vm.Name].PersistentVolumeClaim == nil {
		t.Errorf("--dir %s is not on a writable PersistentVolumeClaim", dir)
	} else if claim := volumes[vm.Name].PersistentVolumeClaim.ClaimName; claim != m.claims[0].Name {
		t.Errorf("--dir %s: claim %q, want the example's %q", dir, claim, m.claims[0].Name)
	}

	ps := pod.SecurityContext
	if ps == nil || ps.RunAsUser == nil || *ps.RunAsUser != *sts.Spec.Template.Spec.SecurityContext.RunAsUser {
		t.Errorf("pod runAsUser: want the StatefulSet's")
	}
	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		t.Errorf("enableServiceLinks: want false, as sluice reads SLUICE_* variables")
	}
}
