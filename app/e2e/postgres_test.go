package e2e

import (
	"context"
	"testing"

	"mesh-controller/app"
	"mesh-controller/embedded/postgres"
	"mesh-controller/embedded/sqlite"
	"mesh-controller/embedded/sqlite/sqlitetest"
)

// The daemon and the commands on stores on PostgreSQL, every context in its
// own database: hosts join, beat and report; modules are assigned, planned,
// signed, sent and applied; a hand declaration, the self-check and the
// listings read it all back. The same acts as on SQLite (TestMesh_…), so
// that every store method the daemon uses runs on PostgreSQL too.
func TestMesh_OnPostgres(t *testing.T) {
	t.Parallel()
	env := map[string]string{}
	for _, name := range app.Contexts {
		env[sqlite.EnvVar(name)] = sqlitetest.NewDatabase(t)
	}
	m := newTestMeshEnv(t, env)
	ctx := context.Background()
	st, err := m.c.Stores(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range app.Contexts {
		if db := st.DB(name); db == nil || !db.Postgres {
			t.Fatalf("the %s store is not on PostgreSQL", name)
		}
	}
	m.join("web1")
	m.join("db1")
	for _, n := range []string{"paperless", "postgres", "smtp-relay"} {
		m.addModule(example(n))
	}
	if _, err := m.c.Assign(ctx, "db1", []string{"postgres", "smtp-relay"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.Assign(ctx, "web1", []string{"paperless"}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, settle, allOf(m.upToDate("web1"), m.notBehind("db1"), m.reported("web1"), m.beating("web1")))
	before := m.node("web1").SerialApplied
	d := m.declare("web1", moduleBody("hello", "/srv/hello"))
	if !d.Sent || d.Serial != before+1 {
		t.Fatalf("declare: %+v after serial %d", d, before)
	}
	checkFor(t, settle, m.applied("web1", d.Serial))
	if _, err := m.c.SelfCheck(ctx, app.CheckOptions{}); err != nil {
		t.Fatal(err)
	}
	list, err := m.c.NodeList(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("node list: %+v, %v", list, err)
	}
	if _, err := m.c.Status(ctx); err != nil {
		t.Fatal(err)
	}
}

// PostgreSQL restarted under a serving controller: while it is down a
// declaration is refused, not half-kept; once it is back the same daemon,
// through the same pools, declares again and the host applies it.
func TestMesh_PostgresRestart(t *testing.T) {
	t.Parallel()
	srv := sqlitetest.NewServer(t)
	admin, _, err := postgres.Open(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, name := range app.Contexts {
		if _, err := admin.Exec(`CREATE DATABASE mesh_` + name); err != nil {
			t.Fatal(err)
		}
		env[sqlite.EnvVar(name)] = sqlitetest.WithDatabase(t, srv.URL, "mesh_"+name)
	}
	admin.Close()
	m := newTestMeshEnv(t, env)
	m.join("web1")
	first := m.declare("web1", moduleBody("hello", "/srv/hello"))
	checkFor(t, settle, m.applied("web1", first.Serial))

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if d, err := m.c.Declare(context.Background(), app.DeclareRequest{Node: "web1", Body: []byte(moduleBody("hello", "/srv/other")), From: "test", Why: "while the server is down"}); err == nil {
		t.Fatalf("a declaration was kept while PostgreSQL was down: %+v", d)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	var d app.Declared
	checkFor(t, settle, func() error {
		var err error
		d, err = m.c.Declare(context.Background(), app.DeclareRequest{Node: "web1", Body: []byte(moduleBody("hello", "/srv/again")), From: "test", Why: "the server is back"})
		return err
	})
	if d.Serial != first.Serial+1 {
		t.Fatalf("serial %d after %d: the refused declaration left something behind", d.Serial, first.Serial)
	}
	checkFor(t, settle, m.applied("web1", d.Serial))
}
