package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/serf/serf"
	"go.yaml.in/yaml/v3"
)

// kubernetesDir holds the manifests deploy/README.md applies.
const kubernetesDir = "../../../../deploy/kubernetes"

// imageUser is the USER of deploy/Dockerfile (which cmd/sluice/dockertest
// checks); the pods run as it.
const imageUser = 65532

// The parts of the Kubernetes objects the checks read; yaml.v3 ignores
// the rest.
type (
	k8sObject struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name      string            `yaml:"name"`
			Namespace string            `yaml:"namespace"`
			Labels    map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Data map[string]string `yaml:"data"` // ConfigMap
		Spec yaml.Node         `yaml:"spec"`
		// Kustomization
		Namespace string   `yaml:"namespace"`
		Resources []string `yaml:"resources"`
	}
	serviceSpec struct {
		ClusterIP                string            `yaml:"clusterIP"`
		PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses"`
		Selector                 map[string]string `yaml:"selector"`
		Ports                    []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
			Protocol   string `yaml:"protocol"`
		} `yaml:"ports"`
	}
	statefulSetSpec struct {
		ServiceName         string `yaml:"serviceName"`
		Replicas            int    `yaml:"replicas"`
		PodManagementPolicy string `yaml:"podManagementPolicy"`
		Selector            struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
	}
	podSpec struct {
		TerminationGracePeriodSeconds int   `yaml:"terminationGracePeriodSeconds"`
		EnableServiceLinks            *bool `yaml:"enableServiceLinks"`
		SecurityContext               struct {
			RunAsNonRoot bool `yaml:"runAsNonRoot"`
			RunAsUser    int  `yaml:"runAsUser"`
		} `yaml:"securityContext"`
		Containers []container `yaml:"containers"`
		Volumes    []struct {
			Name      string `yaml:"name"`
			ConfigMap struct {
				Name string `yaml:"name"`
			} `yaml:"configMap"`
		} `yaml:"volumes"`
	}
	container struct {
		Args []string `yaml:"args"`
		Env  []struct {
			Name      string `yaml:"name"`
			Value     string `yaml:"value"`
			ValueFrom struct {
				FieldRef *struct {
					FieldPath string `yaml:"fieldPath"`
				} `yaml:"fieldRef"`
				SecretKeyRef *struct {
					Optional bool `yaml:"optional"`
				} `yaml:"secretKeyRef"`
			} `yaml:"valueFrom"`
		} `yaml:"env"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
			Protocol      string `yaml:"protocol"`
		} `yaml:"ports"`
		ReadinessProbe k8sProbe `yaml:"readinessProbe"`
		LivenessProbe  k8sProbe `yaml:"livenessProbe"`
		Lifecycle      struct {
			PreStop struct {
				Sleep *struct {
					Seconds int `yaml:"seconds"`
				} `yaml:"sleep"`
			} `yaml:"preStop"`
		} `yaml:"lifecycle"`
		Resources struct {
			Requests map[string]string `yaml:"requests"`
			Limits   map[string]string `yaml:"limits"`
		} `yaml:"resources"`
		SecurityContext struct {
			AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
			ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
			RunAsNonRoot             bool  `yaml:"runAsNonRoot"`
			Capabilities             struct {
				Drop []string `yaml:"drop"`
			} `yaml:"capabilities"`
		} `yaml:"securityContext"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
		} `yaml:"volumeMounts"`
	}
	k8sProbe struct {
		HTTPGet *struct {
			Path string `yaml:"path"`
			Port string `yaml:"port"`
		} `yaml:"httpGet"`
	}
	pdbSpec struct {
		MaxUnavailable int `yaml:"maxUnavailable"`
		Selector       struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
	}
)

// manifests decodes every YAML document of every file in dir, by kind
// and name.
func manifests(t *testing.T, dir string) (map[string]*k8sObject, []string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	objs := make(map[string]*k8sObject)
	var names []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var o k8sObject
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.APIVersion == "" || o.Kind == "" {
				t.Fatalf("%s: a document without apiVersion or kind", f)
			}
			id := o.Kind + "/" + o.Metadata.Name
			if _, dup := objs[id]; dup {
				t.Fatalf("%s: %s is defined twice", f, id)
			}
			objs[id] = &o
		}
		names = append(names, filepath.Base(f))
	}
	return objs, names
}

func object(t *testing.T, objs map[string]*k8sObject, id string) *k8sObject {
	t.Helper()
	o, ok := objs[id]
	if !ok {
		t.Fatalf("no %s among the manifests", id)
	}
	return o
}

// spec decodes o's spec into out.
func spec[T any](t *testing.T, o *k8sObject) T {
	t.Helper()
	var out T
	if err := o.Spec.Decode(&out); err != nil {
		t.Fatalf("%s/%s spec: %v", o.Kind, o.Metadata.Name, err)
	}
	return out
}

// quantity parses a Kubernetes memory quantity with a binary suffix (or
// none).
func quantity(t *testing.T, q string) int64 {
	t.Helper()
	mult := int64(1)
	for i, s := range []string{"Ki", "Mi", "Gi"} {
		if v, ok := strings.CutSuffix(q, s); ok {
			q, mult = v, int64(1)<<(10*(i+1))
			break
		}
	}
	n, err := strconv.ParseInt(q, 10, 64)
	if err != nil {
		t.Fatalf("quantity %q: %v", q, err)
	}
	return n * mult
}

func port(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestKubernetesManifests decodes deploy/kubernetes and checks what must
// hold for the cluster to form and stop cleanly: the daemon accepts the
// ConfigMap's file, its join name is the headless Service's DNS name, the
// ports agree, the probes' paths are the daemon's, the grace period
// outlasts the shutdown, and the memory limit leaves room above the soft
// limit.
func TestKubernetesManifests(t *testing.T) {
	objs, files := manifests(t, kubernetesDir)
	kust := object(t, objs, "Kustomization/")
	for _, f := range files {
		if f != "kustomization.yaml" && !strings.Contains(" "+strings.Join(kust.Resources, " ")+" ", " "+f+" ") {
			t.Errorf("kustomization.yaml does not list %s", f)
		}
	}
	ns := kust.Namespace
	if ns == "" {
		ns = "default"
	}

	sts := spec[statefulSetSpec](t, object(t, objs, "StatefulSet/sluice"))
	pod := sts.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	labels := sts.Template.Metadata.Labels
	matches := func(what string, sel map[string]string) {
		t.Helper()
		if len(sel) == 0 {
			t.Errorf("%s selects nothing", what)
		}
		for k, v := range sel {
			if labels[k] != v {
				t.Errorf("%s selects %s=%s, which the pods do not carry", what, k, v)
			}
		}
	}
	matches("the StatefulSet", sts.Selector.MatchLabels)
	if sts.Replicas != 3 {
		t.Errorf("replicas %d, want 3", sts.Replicas)
	}
	if sts.PodManagementPolicy != "Parallel" {
		t.Errorf("podManagementPolicy %q: a pod is ready only once it joined another, so they must start together", sts.PodManagementPolicy)
	}

	// The daemon's configuration, as the pod loads it: the file the
	// --config argument names, from the ConfigMap mounted there, with the
	// pod's environment.
	var configPath string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--config="); ok {
			configPath = v
		}
	}
	if configPath == "" {
		t.Fatalf("args %q set no --config=", c.Args)
	}
	var cmName string
	for _, m := range c.VolumeMounts {
		if path.Dir(configPath) == path.Clean(m.MountPath) {
			for _, v := range pod.Volumes {
				if v.Name == m.Name {
					cmName = v.ConfigMap.Name
				}
			}
		}
	}
	if cmName == "" {
		t.Fatalf("no ConfigMap volume is mounted at %s", path.Dir(configPath))
	}
	text, ok := object(t, objs, "ConfigMap/"+cmName).Data[path.Base(configPath)]
	if !ok {
		t.Fatalf("ConfigMap %s has no %s", cmName, path.Base(configPath))
	}
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	podEnv := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			podEnv[e.Name] = "sluice-0"
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			podEnv[e.Name] = "10.1.2.3"
		case e.ValueFrom.SecretKeyRef != nil:
			if !e.ValueFrom.SecretKeyRef.Optional {
				t.Errorf("env %s needs a Secret the manifests do not hold: make it optional", e.Name)
			}
		default:
			podEnv[e.Name] = e.Value
		}
	}
	args := slices.Clone(c.Args)
	args[slices.Index(args, "--config="+configPath)] = "--config=" + file
	cfg, err := Load(args, func(k string) string { return podEnv[k] }, io.Discard)
	if err != nil {
		t.Fatalf("the daemon refuses the pod's configuration: %v", err)
	}
	if cfg.NodeName != "sluice-0" || cfg.AdvertiseHost != "10.1.2.3" {
		t.Errorf("node name %q and advertise host %q, want the pod's name and IP", cfg.NodeName, cfg.AdvertiseHost)
	}
	// Every pod joins the others, so none starts the cluster alone: they
	// form it once they all see each other.
	if cfg.BootstrapExpect != sts.Replicas {
		t.Errorf("bootstrap_expect %d, want the StatefulSet's replicas %d: the pods would never be ready, or could form apart",
			cfg.BootstrapExpect, sts.Replicas)
	}

	// Ports: the daemon's, the container's, the Services'. Peers have a
	// port of their own, which clients' Service does not reach.
	if cfg.PeerAddr == "" {
		t.Fatal("the ConfigMap sets no peer_addr: peers would share grpc_addr, and its connection cap, with clients")
	}
	containerPorts := map[string]int{} // name -> port
	protocols := map[string]string{}
	for _, p := range c.Ports {
		containerPorts[p.Name], protocols[p.Name] = p.ContainerPort, p.Protocol
	}
	for name, want := range map[string]int{
		"gossip-tcp": port(t, cfg.GossipAddr), "gossip-udp": port(t, cfg.GossipAddr),
		"grpc": port(t, cfg.GRPCAddr), "http": port(t, cfg.HTTPAddr),
		"peer": port(t, cfg.PeerAddr),
	} {
		if containerPorts[name] != want {
			t.Errorf("container port %s is %d, the daemon's %d", name, containerPorts[name], want)
		}
	}
	if protocols["gossip-udp"] != "UDP" {
		t.Errorf("gossip-udp is %s: memberlist probes over UDP", protocols["gossip-udp"])
	}
	checkService := func(name string, want ...string) serviceSpec {
		t.Helper()
		s := spec[serviceSpec](t, object(t, objs, "Service/"+name))
		matches("Service "+name, s.Selector)
		var got []string
		for _, p := range s.Ports {
			got = append(got, p.TargetPort)
			if containerPorts[p.TargetPort] != p.Port || protocols[p.TargetPort] != p.Protocol {
				t.Errorf("Service %s port %s is %d/%s, the container's %d/%s",
					name, p.Name, p.Port, p.Protocol, containerPorts[p.TargetPort], protocols[p.TargetPort])
			}
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("Service %s targets %v, want %v", name, got, want)
		}
		return s
	}
	headless := checkService(sts.ServiceName, "gossip-tcp", "gossip-udp", "peer")
	if headless.ClusterIP != "None" || !headless.PublishNotReadyAddresses {
		t.Errorf("Service %s: clusterIP %q, publishNotReadyAddresses %v; want None and true: pods must find each other before they are ready",
			sts.ServiceName, headless.ClusterIP, headless.PublishNotReadyAddresses)
	}
	if client := checkService("sluice", "grpc", "http"); client.ClusterIP == "None" {
		t.Error("the clients' Service is headless")
	}

	// join is the headless Service's DNS name alone.
	wantJoin := net.JoinHostPort(sts.ServiceName+"."+ns+".svc.cluster.local", strconv.Itoa(port(t, cfg.GossipAddr)))
	if len(cfg.Join) != 1 || cfg.Join[0] != wantJoin {
		t.Errorf("join %q, want [%s]", cfg.Join, wantJoin)
	}

	// Probes: readiness follows the join, liveness does not.
	joined := start(t, testConfig("deploy-joined"))
	lonely := testConfig("deploy-lonely")
	lonely.Join = []string{"127.0.0.1:1"} // nobody answers there
	alone := start(t, lonely)
	for _, p := range []struct {
		what          string
		probe         k8sProbe
		path          string
		joined, alone int // status of a daemon that joined, and of one that cannot
	}{
		{"readinessProbe", c.ReadinessProbe, "/readyz", 200, 503},
		{"livenessProbe", c.LivenessProbe, "/healthz", 200, 200},
	} {
		get := p.probe.HTTPGet
		switch {
		case get == nil:
			t.Errorf("%s is not an httpGet", p.what)
			continue
		case get.Path != p.path:
			t.Errorf("%s path %q, want %s", p.what, get.Path, p.path)
		case get.Port != "http":
			t.Errorf("%s port %q, want http", p.what, get.Port)
		}
		for _, d := range []struct {
			d    *Daemon
			want int
		}{{joined, p.joined}, {alone, p.alone}} {
			if got := do(t, "GET", "http://"+d.d.HTTPAddr()+get.Path, "").status; got != d.want {
				t.Errorf("%s: GET %s of %s: %d, want %d", p.what, get.Path, d.d.cfg.NodeName, got, d.want)
			}
		}
	}

	// Shutdown: preStop, then the daemon's shutdown_delay, HTTP drain
	// (shutdown_timeout) and leave: the hand-off (leave_timeout), serf's
	// leave (two broadcast timeouts and the propagation delay) and the
	// drain of peer calls (leave_timeout).
	preStop := 0 * time.Second
	if s := c.Lifecycle.PreStop.Sleep; s != nil {
		preStop = time.Duration(s.Seconds) * time.Second
	} else {
		t.Error("no preStop sleep")
	}
	sc := serf.DefaultConfig()
	shutdown := preStop + cfg.ShutdownDelay + cfg.ShutdownTimeout +
		2*cfg.LeaveTimeout + 2*sc.BroadcastTimeout + sc.LeavePropagateDelay
	if grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; grace <= shutdown {
		t.Errorf("terminationGracePeriodSeconds %v, want more than the %v a graceful shutdown may take", grace, shutdown)
	}

	// Memory: the limit leaves room above the soft limit, which the
	// request covers.
	soft := cfg.SoftMemoryLimit()
	limit := quantity(t, c.Resources.Limits["memory"])
	request := quantity(t, c.Resources.Requests["memory"])
	if soft == 0 || soft > limit*4/5 || request < soft {
		t.Errorf("soft memory limit %d MiB, container request %d MiB and limit %d MiB: want a soft limit at most 80%% of the limit and a request at least the soft limit",
			soft>>20, request>>20, limit>>20)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Limits["cpu"] == "" {
		t.Error("no CPU request or limit")
	}

	// Security.
	sec := c.SecurityContext
	if !pod.SecurityContext.RunAsNonRoot || pod.SecurityContext.RunAsUser != imageUser || !sec.RunAsNonRoot ||
		!sec.ReadOnlyRootFilesystem || sec.AllowPrivilegeEscalation == nil || *sec.AllowPrivilegeEscalation ||
		fmt.Sprint(sec.Capabilities.Drop) != "[ALL]" {
		t.Errorf("security contexts %+v, %+v: want non-root as %d, a read-only root, no privilege escalation, every capability dropped",
			pod.SecurityContext, sec, imageUser)
	}
	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		t.Error("enableServiceLinks: the Service sluice would set SLUICE_* variables beside the daemon's settings")
	}

	pdb := spec[pdbSpec](t, object(t, objs, "PodDisruptionBudget/sluice"))
	matches("the PodDisruptionBudget", pdb.Selector.MatchLabels)
	if pdb.MaxUnavailable != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable %d, want 1", pdb.MaxUnavailable)
	}
}
