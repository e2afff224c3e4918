package sluice_test

import (
	"errors"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The adapters and the rules depend on the vocabulary, not on the
// cluster: importing them pulls in no gossip, no cluster and, but for
// grpclimit itself, no gRPC.
func TestAdaptersPullInNoCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for pkg, banned := range map[string][]string{
		"./httplimit":  {"hashicorp/serf", "hashicorp/memberlist", "google.golang.org/grpc", "sluice/cluster", "sluice/transport", "sluice/internal/transport", "sluice/internal/peer"},
		"./rules":      {"hashicorp/serf", "hashicorp/memberlist", "google.golang.org/grpc", "sluice/cluster", "sluice/transport", "sluice/internal/transport", "sluice/internal/peer"},
		"./envoyrls":   {"hashicorp/serf", "hashicorp/memberlist", "sluice/cluster", "sluice/transport", "sluice/internal/transport", "sluice/internal/peer"},
		"./grpclimit":  {"hashicorp/serf", "hashicorp/memberlist", "sluice/cluster", "sluice/transport", "sluice/internal/transport", "sluice/internal/peer"},
		"./redislimit": {"hashicorp/serf", "hashicorp/memberlist", "google.golang.org/grpc", "sluice/cluster", "sluice/transport", "sluice/internal/transport", "sluice/internal/peer"},
		".":            {"hashicorp/serf", "hashicorp/memberlist", "google.golang.org/grpc", "sluice/cluster", "sluice/transport", "sluice/internal/transport", "sluice/internal/peer"},
	} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 5 {
			t.Fatalf("go list -deps %s listed only %v", pkg, deps)
		}
		for _, d := range deps {
			for _, b := range banned {
				if strings.Contains(d, b) {
					t.Errorf("%s depends on %s", pkg, d)
				}
			}
		}
	}
}

// The packages a user may import; the rest of the module is internal/ or a
// command. A package joins this list on purpose: whatever is public here
// is an API to keep.
var publicPackages = []string{
	"github.com/sluicehq/sluice",
	"github.com/sluicehq/sluice/client",
	"github.com/sluicehq/sluice/cluster",
	"github.com/sluicehq/sluice/envoyrls",
	"github.com/sluicehq/sluice/grpclimit",
	"github.com/sluicehq/sluice/httplimit",
	"github.com/sluicehq/sluice/limiter",
	"github.com/sluicehq/sluice/redislimit",
	"github.com/sluicehq/sluice/retry",
	"github.com/sluicehq/sluice/ring",
	"github.com/sluicehq/sluice/rules",
	"github.com/sluicehq/sluice/testcluster",
	"github.com/sluicehq/sluice/transport",
	"github.com/sluicehq/sluice/transport/sluicev1",
}

// goList runs go list with args and returns its output's lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

func isInternal(path string) bool {
	return strings.Contains(path, "/internal/") || strings.HasSuffix(path, "/internal")
}

// The module's public packages are exactly publicPackages: sluice's own
// machinery (the peer forwarder, the wire codec, peer authentication, the
// message budget) is under internal/, where nothing outside the module can
// import it, and the transport package holds the wire contract (the .proto
// and sluicev1) with no Go API of its own.
func TestDepsPublicPackages(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	var got []string
	for _, l := range goList(t, "-f", "{{.ImportPath}} {{.Name}}", "./...") {
		path, name, _ := strings.Cut(l, " ")
		if name == "main" || isInternal(path) || strings.Contains(path, "/cmd/") {
			continue
		}
		got = append(got, path)
	}
	if !slices.Equal(got, publicPackages) {
		t.Errorf("public packages:\n\t%s\nwant:\n\t%s\n(move a package that only sluice uses under internal/; add one users import to publicPackages)",
			strings.Join(got, "\n\t"), strings.Join(publicPackages, "\n\t"))
	}

	pkg := importPublic(t, "github.com/sluicehq/sluice/transport")["github.com/sluicehq/sluice/transport"]
	for _, name := range pkg.Scope().Names() {
		if token.IsExported(name) {
			t.Errorf("package transport exports %s: its Go API is sluicev1, the rest is internal/transport", name)
		}
	}
}

// importPublic type-checks nothing itself: it loads the compiler's export
// data of paths and their dependencies (go list -export) and returns the
// packages of paths.
func importPublic(t *testing.T, paths ...string) map[string]*types.Package {
	t.Helper()
	exports := map[string]string{}
	for _, l := range goList(t, append([]string{"-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}, paths...)...) {
		path, file, _ := strings.Cut(l, "\t")
		exports[path] = file
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		file := exports[path]
		if file == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
	pkgs := map[string]*types.Package{}
	for _, p := range paths {
		pkg, err := imp.Import(p)
		if err != nil {
			t.Fatalf("import %s: %v", p, err)
		}
		pkgs[p] = pkg
	}
	return pkgs
}

// No public package's exported API names a type of an internal package
// that users cannot name: every such type is reached through an alias in a
// public package (cluster.ServerLimits = transport.ServerLimits), and what
// it exposes (fields, methods) obeys the same rule.
func TestDepsPublicAPINamesNoInternalType(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for _, pkg := range importPublic(t, publicPackages...) {
		for _, p := range apiLeaks(pkg) {
			t.Errorf("%s", p)
		}
	}
}

// apiLeaks returns, for each exported identifier of pkg whose API names a
// type of an internal package other than through a public alias, where it
// does.
func apiLeaks(pkg *types.Package) []string {
	w := apiWalker{seen: map[types.Type]bool{}}
	for _, name := range pkg.Scope().Names() {
		obj := pkg.Scope().Lookup(name)
		if !obj.Exported() {
			continue
		}
		w.where = pkg.Path() + "." + name
		switch obj := obj.(type) {
		case *types.TypeName:
			if a, ok := obj.Type().(*types.Alias); ok {
				w.alias(a)
			} else {
				w.named(obj.Type())
			}
		default: // funcs, vars, consts
			w.typ(obj.Type())
		}
	}
	return w.leaks
}

type apiWalker struct {
	where string
	seen  map[types.Type]bool
	leaks []string
}

// alias walks what the type behind a public alias exposes; the type itself
// may be internal, since users name it through the alias.
func (w *apiWalker) alias(a *types.Alias) {
	if a.Obj().Pkg() != nil && isInternal(a.Obj().Pkg().Path()) {
		w.leaks = append(w.leaks, fmt.Sprintf("%s names %s, an alias of an internal package", w.where, a))
		return
	}
	w.named(types.Unalias(a))
}

// named walks the exported fields and methods of t, a type users can name.
func (w *apiWalker) named(t types.Type) {
	if w.seen[t] {
		return
	}
	w.seen[t] = true
	n, ok := t.(*types.Named)
	if !ok {
		w.typ(t)
		return
	}
	for i := range n.NumMethods() {
		if m := n.Method(i); m.Exported() {
			w.typ(m.Type())
		}
	}
	for i := range n.TypeArgs().Len() {
		w.typ(n.TypeArgs().At(i))
	}
	w.typ(n.Underlying())
}

// typ walks t, which an exported identifier's API names.
func (w *apiWalker) typ(t types.Type) {
	switch t := t.(type) {
	case *types.Alias:
		w.alias(t)
	case *types.Named:
		pkg := t.Obj().Pkg()
		switch {
		case pkg == nil:
		case isInternal(pkg.Path()):
			w.leaks = append(w.leaks, fmt.Sprintf("%s names %s, which users cannot name", w.where, t))
		case strings.HasPrefix(pkg.Path(), "github.com/sluicehq/sluice"):
			w.named(t) // a public type of the module: walked as its own identifier too
		}
		for i := range t.TypeArgs().Len() {
			w.typ(t.TypeArgs().At(i))
		}
	case *types.Pointer:
		w.typ(t.Elem())
	case *types.Slice:
		w.typ(t.Elem())
	case *types.Array:
		w.typ(t.Elem())
	case *types.Chan:
		w.typ(t.Elem())
	case *types.Map:
		w.typ(t.Key())
		w.typ(t.Elem())
	case *types.Signature:
		for v := range t.Params().Variables() {
			w.typ(v.Type())
		}
		for v := range t.Results().Variables() {
			w.typ(v.Type())
		}
	case *types.Struct:
		for f := range t.Fields() {
			if f.Exported() {
				w.typ(f.Type())
			}
		}
	case *types.Interface:
		for m := range t.Methods() {
			if m.Exported() {
				w.typ(m.Type())
			}
		}
	}
}

// The examples are code users copy: they import only public packages.
func TestDepsExamplesImportNoInternal(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	lines := goList(t, "-f", "{{.ImportPath}} {{join .Imports \" \"}} {{join .TestImports \" \"}} {{join .XTestImports \" \"}}", "./examples/...")
	if len(lines) < 3 {
		t.Fatalf("go list ./examples/... listed only %v", lines)
	}
	for _, l := range lines {
		f := strings.Fields(l)
		for _, imp := range f[1:] {
			if isInternal(imp) && strings.HasPrefix(imp, "github.com/sluicehq/sluice") {
				t.Errorf("%s imports %s", f[0], imp)
			}
		}
	}
}
