package app

import (
	"go/constant"
	"go/types"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"golang.org/x/tools/go/callgraph/static"
	"golang.org/x/tools/go/packages"
	"golang.org/x/tools/go/ssa"
	"golang.org/x/tools/go/ssa/ssautil"
)

// storeFields are the contexts' stores as app.Stores names them.
var storeFields = map[string]string{"Inventory": "inventory", "Identity": "identity", "Secrets": "secrets",
	"Licences": "licences", "Health": "health", "Builds": "builds"}

// reached are, for each service, the stores its use cases reach: every
// function statically called from one of its methods (and the functions
// written inside them), and each field of app.Stores or DB(name) read there.
func reached(t *testing.T) map[string][]string {
	t.Helper()
	cfg := &packages.Config{Mode: packages.LoadAllSyntax, Dir: "..", Env: append(os.Environ(), "CGO_ENABLED=0")}
	pkgs, err := packages.Load(cfg, "mesh-controller/app")
	if err != nil || packages.PrintErrors(pkgs) > 0 {
		t.Fatalf("load app: %v", err)
	}
	prog, ssaPkgs := ssautil.AllPackages(pkgs, ssa.InstantiateGenerics)
	prog.Build()
	app := ssaPkgs[0]
	cg := static.CallGraph(prog)
	uses := func(fn *ssa.Function, into map[string]bool) {
		for _, b := range fn.Blocks {
			for _, ins := range b.Instrs {
				switch v := ins.(type) {
				case *ssa.FieldAddr:
					if isStores(v.X.Type()) {
						if name, ok := storeFields[fieldName(v.X.Type(), v.Field)]; ok {
							into[name] = true
						}
					}
				case *ssa.Call:
					if callee := v.Call.StaticCallee(); callee != nil && callee.Name() == "DB" && callee.Signature.Recv() != nil && isStores(callee.Signature.Recv().Type()) {
						if c, ok := v.Call.Args[1].(*ssa.Const); ok && c.Value != nil && c.Value.Kind() == constant.String {
							into[constant.StringVal(c.Value)] = true
						} else {
							into["every"] = true
						}
					}
				}
			}
		}
	}
	out := map[string][]string{}
	for _, svc := range []string{"Nodes", "Modules", "Seats", "Secrets", "Licences", "Builds", "Health", "Copies", "Server"} {
		T := app.Pkg.Scope().Lookup(svc).Type()
		ms := prog.MethodSets.MethodSet(types.NewPointer(T))
		seen := map[*ssa.Function]bool{}
		var queue []*ssa.Function
		push := func(f *ssa.Function) {
			// A method value's wrapper is synthetic, of no package: the
			// method it wraps is its callee.
			ours := f != nil && (f.Pkg == app || f.Synthetic != "" && f.Object() != nil && f.Object().Pkg() == app.Pkg)
			if ours && !seen[f] {
				seen[f] = true
				queue = append(queue, f)
			}
		}
		for i := 0; i < ms.Len(); i++ {
			sel := ms.At(i)
			if sel.Obj().Exported() && len(sel.Index()) == 1 { // declared on the service itself
				push(prog.MethodValue(sel))
			}
		}
		got := map[string]bool{}
		for len(queue) > 0 {
			f := queue[0]
			queue = queue[1:]
			uses(f, got)
			// A function or method handed on as a value may be called
			// anywhere: it is reached where it is named.
			for _, b := range f.Blocks {
				for _, ins := range b.Instrs {
					var ops []*ssa.Value
					for _, op := range ins.Operands(ops) {
						if g, ok := (*op).(*ssa.Function); ok {
							push(g)
						}
					}
				}
			}
			for _, a := range f.AnonFuncs {
				push(a)
			}
			if n := cg.Nodes[f]; n != nil {
				for _, e := range n.Out {
					push(e.Callee.Func)
				}
			}
		}
		var names []string
		for n := range got {
			names = append(names, n)
		}
		sort.Strings(names)
		out[svc] = names
	}
	return out
}

func isStores(t types.Type) bool {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	return ok && n.Obj().Name() == "Stores" && n.Obj().Pkg().Path() == "mesh-controller/app"
}

func fieldName(t types.Type, i int) string {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	return t.Underlying().(*types.Struct).Field(i).Name()
}

// Each service names every store its use cases reach, so none reaches one
// it does not name (its view holds only those: one it did not name would be
// nil); and names none it does not reach.
func TestServicesReachOnlyTheStoresTheyName(t *testing.T) {
	for svc, got := range reached(t) {
		if slices.Contains(got, "every") {
			got = Contexts
		}
		named := serviceStores[svc]
		for _, name := range got {
			if !slices.Contains(named, name) {
				t.Errorf("%s reaches the %s store, which it does not name (it names %s)", svc, name, strings.Join(named, ", "))
			}
		}
		for _, name := range named {
			if !slices.Contains(got, name) {
				t.Errorf("%s names the %s store, which none of its use cases reaches", svc, name)
			}
		}
	}
}
