package main

import (
	"errors"
	"fmt"

	"mesh-controller/app"
	"mesh-controller/app/protocol"
	"mesh-controller/contexts/builds"
	"mesh-controller/contexts/health"
	"mesh-controller/contexts/identity"
	"mesh-controller/contexts/inventory"
	"mesh-controller/contexts/licences"
	"mesh-controller/contexts/secrets"
	"mesh-controller/embedded/postgres"
	"mesh-controller/embedded/sqlite"
)

// storeVar names what moves a store, for a hint.
func storeVar(se *app.StoreError) string {
	if se == nil {
		return "the store"
	}
	if se.Location.From == "data dir" {
		return se.Location.Shown()
	}
	return se.Location.Var
}

// postgresHint says what to do about a store on PostgreSQL that cannot be
// reached or used: the SQL a person runs as the server's superuser (or the
// database's owner), with the URL's own names. migrate never makes
// databases or roles: they are the person's, like the server.
func postgresHint(err error, se *app.StoreError) string {
	v := storeVar(se)
	var pe *postgres.Error
	errors.As(err, &pe)
	var t postgres.Target
	if pe != nil {
		t = pe.Target
	}
	switch {
	case errors.Is(err, postgres.ErrBadURL):
		return fmt.Sprintf("write %s as postgres://USER:PASSWORD@HOST:PORT/DATABASE", v)
	case errors.Is(err, postgres.ErrUnreachable):
		return fmt.Sprintf("check the host and port in %s, and that PostgreSQL runs there and listens on them", v)
	case errors.Is(err, postgres.ErrNoDatabase):
		return fmt.Sprintf("create it as PostgreSQL's superuser: CREATE DATABASE %s OWNER %s; then run 'mesh-controller migrate'", t.Database, t.User)
	case errors.Is(err, postgres.ErrNoRole):
		return fmt.Sprintf("create the role as PostgreSQL's superuser: CREATE ROLE %s LOGIN PASSWORD '…'; and give it its database: ALTER DATABASE %s OWNER TO %s; (CREATE DATABASE %s OWNER %s; if it is missing too)",
			t.User, t.Database, t.User, t.Database, t.User)
	case errors.Is(err, postgres.ErrAuth):
		return fmt.Sprintf("check the user and password in %s (PostgreSQL's log says why it refused)", v)
	case errors.Is(err, postgres.ErrNoRights):
		return fmt.Sprintf("let the role make its tables, as the database's owner: GRANT CREATE, USAGE ON SCHEMA public TO %s; (or make it the owner: ALTER DATABASE %s OWNER TO %s;)", t.User, t.Database, t.User)
	}
	return ""
}

// hint is the "what to do" half of an error line: the app says what went
// wrong, the command line says what a person can do about it.
func hint(err error) string {
	if h := dataHint(err); h != "" {
		return h
	}
	var se *app.StoreError
	isStore := errors.As(err, &se)
	moved := isStore && se.Location.From != "data dir"
	if h := postgresHint(err, se); h != "" {
		return h
	}
	switch {
	case errors.Is(err, app.ErrUnknownContext):
		return "name one of those ('mesh-controller help' lists each context's store)"
	case errors.Is(err, app.ErrCopyTarget):
		return "give each context a store of its own to copy onto"
	case errors.Is(err, sqlite.ErrNotEmpty):
		return "copy onto an empty database (a copy never merges): name another, or drop and create this one again"
	case errors.Is(err, sqlite.ErrCopyDiffers):
		return "nothing was kept (the copy was rolled back); please report it"
	case errors.Is(err, app.ErrServed):
		return "stop that controller first; or start this binary's 'serve' beside it (with --broker), which stands by and migrates them when it takes the lease over"
	case errors.Is(err, sqlite.ErrNoStore), errors.Is(err, sqlite.ErrBehind):
		if moved {
			return fmt.Sprintf("run 'mesh-controller migrate' first, or check %s", se.Location.Var)
		}
		return "run 'mesh-controller migrate' first"
	case errors.Is(err, sqlite.ErrNotSQLite) && isStore:
		return fmt.Sprintf("check %s, or move that file away and run 'mesh-controller migrate'", se.Location.Var)
	case errors.Is(err, app.ErrIdentityLost):
		return "restore the controller's stores from a backup ('mesh-controller store restore FILE --data DIR --key OPERATOR-KEY'), or, to start a new identity, run 'mesh-controller migrate --new-identity' and join every node again"
	case errors.Is(err, sqlite.ErrSymlink):
		return fmt.Sprintf("give %s a real file's path, not a link", storeVar(se))
	case errors.Is(err, sqlite.ErrOpenTwice):
		return "this is a defect: a process opens each store once; please report it"
	case errors.Is(err, app.ErrBackupNewer):
		return "restore it with the mesh-controller that made it"
	case errors.Is(err, sqlite.ErrSchemaNewer):
		return "run the mesh-controller that migrated it"
	case errors.Is(err, sqlite.ErrMigrationChanged):
		return "restore the migration as it shipped: applied migrations are never edited"
	case errors.Is(err, identity.ErrNoSigningKey):
		return "run 'mesh-controller migrate' to make it"
	case errors.Is(err, app.ErrReservedName):
		return "choose another name for the node"
	case errors.Is(err, inventory.ErrNodeExists):
		return "choose another name ('mesh-controller node list' shows those taken)"
	case errors.Is(err, inventory.ErrAdoptedAlready):
		return "there is nothing to return ('mesh-controller node list' shows each node's mode)"
	case errors.Is(err, inventory.ErrNodeNotFound):
		return "add it with 'mesh-controller node add', or see 'mesh-controller node list'"
	case errors.Is(err, identity.ErrLeaseLost):
		return "another controller took the lease over while this one was paused or cut off, and this one stopped writing; start it again to stand by (with --broker)"
	case errors.Is(err, identity.ErrLeaseHeld):
		return "stop that controller first (SIGINT or SIGTERM gives the lease back), or wait until its lease expires; to stand by for it, serve with --broker on a NATS server both reach (an embedded broker cannot be shared)"
	case errors.Is(err, identity.ErrNoBrokerKeys):
		return "run 'mesh-controller migrate' to make them"
	case errors.Is(err, identity.ErrOverlapRunning):
		return "rotate again once it has ended (at most two keys are accepted at once)"
	case errors.Is(err, app.ErrHostsCannotFollow):
		return "upgrade those hosts first ('mesh-controller host upgrade --nodes … --to VERSION'), or rotate with --leave-behind: they then refuse every declaration until upgraded and joined again"
	case errors.Is(err, app.ErrBadOverlap):
		return "give --overlap as a duration, e.g. 168h (a week), or 0 to retire the old key at once"
	case errors.Is(err, health.ErrNoWhy):
		return "add --why \"...\""
	case errors.Is(err, app.ErrTooLarge):
		return "check it is the input you meant, or make it smaller"
	case errors.Is(err, app.ErrNotAnObject):
		return "write the body as one JSON object, e.g. {\"modules\": []}"
	case errors.Is(err, app.ErrNoBuilder):
		return "assign a module that can fill it (the builder, run by mesh-builder) to a node; the ask waits for it"
	case errors.Is(err, inventory.ErrRepositoryCredential):
		return inventory.RepositoryCredentialHint
	case errors.Is(err, app.ErrBuildFailed):
		return "see its log with 'mesh-controller build list --json', mend the source and build again"
	case errors.Is(err, app.ErrStandsOnCycle):
		return "remove one of those stands_on, register the manifest, and build again"
	case errors.Is(err, app.ErrPlanFailed):
		return "see why with 'mesh-controller build plans' and 'mesh-controller build list MODULE', mend it, then 'mesh-controller build plans retry ID' (or close it)"
	case errors.Is(err, app.ErrPlanProblems):
		return "mend each, then make the plan again"
	case errors.Is(err, builds.ErrPlanNotFound):
		return "see 'mesh-controller build plans' for the ids"
	case errors.Is(err, builds.ErrPlanNotRunning), errors.Is(err, builds.ErrPlanNotFailed):
		return "see where it stands with 'mesh-controller build plans': a running plan is stopped, a failed one retried or closed"
	case errors.Is(err, builds.ErrNotFound), errors.Is(err, builds.ErrBadID):
		return "see 'mesh-controller build queue' and 'mesh-controller build list' for the ids"
	case errors.Is(err, builds.ErrEnded), errors.Is(err, builds.ErrInFlight):
		return "see 'mesh-controller build queue'"
	case errors.Is(err, app.ErrConverged):
		return "assign the module instead ('mesh-controller assign NODE MODULE'): the mesh owns what runs there"
	case errors.Is(err, app.ErrTakeDigestUnknown), errors.Is(err, app.ErrTakeChanged):
		return "look at the preview again ('mesh-controller take NODE MODULE') and confirm its digest"
	case errors.Is(err, app.ErrConvergedAlready):
		return "see 'mesh-controller node show NODE'; converge with another --filter (or none) to change its filter, or 'mesh-controller adopt NODE' to return it to adopted"
	case errors.Is(err, app.ErrConvergeDigestUnknown), errors.Is(err, app.ErrConvergeChanged):
		return "look at the preview again ('mesh-controller converge NODE', with the same --filter) and confirm its digest"
	case errors.Is(err, app.ErrNoFacts):
		return "start its host ('mesh-host run') and converge once it has reported, or see 'mesh-controller node show NODE'"
	case errors.Is(err, app.ErrTakeSymlink):
		return "make that path a directory (or a file) of its own on the node, or change the manifest's data path, then take again"
	case errors.Is(err, app.ErrAlreadyOnNode):
		return "see 'mesh-controller plan NODE'"
	case errors.Is(err, app.ErrNotConnected):
		return "start its host ('mesh-host run'), or see 'mesh-controller node show NODE'"
	case errors.Is(err, app.ErrNoSuchTool):
		return "ask one of the tools its manifest names"
	case errors.Is(err, licences.ErrNotRefreshable):
		return "a licence added without --refreshable is replaced, not refreshed: add its replacement with 'mesh-controller licence add'"
	case errors.Is(err, licences.ErrNoManager):
		return "name one with 'mesh-controller licence manager NAME NODE/MODULE --key OPERATOR-KEY'"
	case errors.Is(err, app.ErrNoRefreshTool):
		return "name as manager a module whose manifest has the tool refresh"
	case errors.Is(err, app.ErrBadRefresh), errors.Is(err, app.ErrManagerRefused):
		return "read the manager's log ('mesh-controller logs NODE MODULE')"
	case errors.Is(err, app.ErrNoInstance):
		return "see where it runs and its state ('mesh-controller status', 'mesh-controller node show NODE')"
	case errors.Is(err, app.ErrNoAnswer):
		return "ask again with a longer --timeout, or read its log ('mesh-controller logs NODE MODULE')"
	case errors.Is(err, app.ErrBrokerUnreachable):
		return "start 'mesh-controller serve', or check --broker"
	case errors.Is(err, inventory.ErrModuleNotFound):
		return "register it with 'mesh-controller module add FILE', or see 'mesh-controller module list'"
	case errors.Is(err, inventory.ErrVersionConflict):
		return "give the changed manifest a new version"
	case errors.Is(err, app.ErrSettingsNotObject):
		return "write the settings as one JSON object"
	case errors.Is(err, app.ErrNoManifests):
		return "name manifest files, or directories holding mesh.json files or .json manifests"
	case errors.Is(err, app.ErrNotOnNode):
		return "assign it there first with 'mesh-controller assign'"
	case errors.Is(err, app.ErrRollOutRolledBack):
		return "every node it moved runs the version it ran again (each said above): fix what failed, and roll out again"
	case errors.Is(err, app.ErrRollOutStopped):
		return "fix that node and roll out again: the nodes before it run the new version, those after it the old"
	case errors.Is(err, secrets.ErrNoOperatorKey):
		return "set one with 'mesh-controller operator key set' (make one off the mesh with 'mesh-controller operator key make')"
	case errors.Is(err, secrets.ErrOperatorKeySet):
		return "add --replace to replace it (the old key is not revoked: it still opens what was sealed to it)"
	case errors.Is(err, app.ErrNotJoined):
		return "join it with a token first ('mesh-controller token issue --node NAME', then 'mesh-host join')"
	case errors.Is(err, app.ErrSecretNotNamed):
		return "accept only the secrets its manifest names ('mesh-controller plan NODE' shows what it waits for)"
	case errors.Is(err, app.ErrMadeByMesh):
		return "the mesh makes and seals it itself"
	case errors.Is(err, app.ErrWrongOperatorKey):
		return "give the operator key file it was sealed to ('mesh-controller operator key show' says which copies only an older key opens)"
	case errors.Is(err, app.ErrNotOperatorKey):
		return "give the file 'mesh-controller operator key make' wrote (AGE-SECRET-KEY-1…)"
	case errors.Is(err, app.ErrNotAnExport):
		return "give a file 'mesh-controller secret export' wrote"
	case errors.Is(err, app.ErrBadRecipient):
		return "give the public half printed by 'mesh-controller operator key make'"
	case errors.Is(err, app.ErrEmptySecret), errors.Is(err, app.ErrEmptyLicence):
		return "give the value itself"
	case errors.Is(err, app.ErrNotTokens), errors.Is(err, app.ErrNoRefresh), errors.Is(err, app.ErrNoAccess):
		return `write a refreshable licence's file as {"access_token": "…", "refresh_token": "…", "expires_at": "RFC 3339"}, or add it without --refreshable`
	case errors.Is(err, app.ErrBadExpires):
		return "give --expires as 2027-01-31T00:00:00Z, 720h or 90d"
	case errors.Is(err, app.ErrExpired):
		return "give the token's real expiry, or a fresh token"
	case errors.Is(err, app.ErrBadProvider):
		return "name the provider as a name, such as openai"
	case errors.Is(err, licences.ErrExists):
		return "choose another name, or see 'mesh-controller licence list'"
	case errors.Is(err, licences.ErrNoLicence):
		return "see the licences with 'mesh-controller licence list', or add it with 'mesh-controller licence add'"
	case errors.Is(err, licences.ErrHeld):
		return "nothing to do ('mesh-controller licence list' shows its holders)"
	case errors.Is(err, licences.ErrNotHeld):
		return "see its holders with 'mesh-controller licence list'"
	case errors.Is(err, licences.ErrVersionMoved):
		return "it changed meanwhile (refreshed, or its holders changed): run the command again"
	case errors.Is(err, licences.ErrNoCopy):
		return "see which versions are kept with 'mesh-controller licence key NAME'"
	case errors.Is(err, secrets.ErrNoSecret):
		return "see which secrets the mesh holds with 'mesh-controller secret export'"
	case errors.Is(err, health.ErrNoCondition):
		return "see the open ones with 'mesh-controller conditions'"
	case errors.Is(err, health.ErrNoVerdict):
		return "run it with 'mesh-controller doctor run' ('mesh-controller serve' runs it every 30 s)"
	case errors.Is(err, health.ErrBrakeNotEngaged):
		return "nothing to release ('mesh-controller healers' shows the brake)"
	case errors.Is(err, app.ErrBadCause):
		return "give --cause one word, such as disk or network"
	case errors.Is(err, inventory.ErrSeatNotFound):
		return "see the seats with 'mesh-controller seat list'"
	case errors.Is(err, app.ErrHolderForm):
		return "write it as NODE/MODULE, such as web1/paperless"
	case errors.Is(err, app.ErrNotReplicated), errors.Is(err, app.ErrCannotHold):
		return "see 'mesh-controller seat list'"
	case errors.Is(err, app.ErrEmptyReplace):
		return "back the data up or move it first, or add --yes --why \"...\" to go ahead all the same (the hand-act log records that choice)"
	case errors.Is(err, app.ErrNotAProvider):
		return "pin a node/module that provides it ('mesh-controller plan NODE' shows the bindings)"
	case errors.Is(err, app.ErrNothingWaiting):
		return "see who waits with 'mesh-controller retire'"
	case errors.Is(err, app.ErrNotRetired):
		return "see what is retired with 'mesh-controller cleanup'"
	case errors.Is(err, app.ErrNoPin):
		return "see the bindings with 'mesh-controller plan NODE'"
	case errors.Is(err, app.ErrNothingToRotate):
		return "a provider gives per-consumer credentials when its manifest says per_consumer.credential"
	case errors.Is(err, app.ErrBadCount):
		return fmt.Sprintf("give --count a number from 1 to %d", app.MaxNodesAtOnce)
	case errors.Is(err, protocol.ErrBadDomain):
		return "write it as lower-case labels joined by dots, such as example.org"
	case errors.Is(err, protocol.ErrBadNetwork):
		return "write each network as a CIDR prefix, such as 10.20.0.0/16"
	case errors.Is(err, protocol.ErrNetworksOverlap):
		return "give each network once: drop the one the other contains, or join them"
	case errors.Is(err, protocol.ErrOverlapsOverlay):
		return "route a network outside the overlay's ranges"
	case errors.Is(err, protocol.ErrTooManyNetworks):
		return "join neighbouring networks into wider ones"
	case errors.Is(err, app.ErrBadEndpoint):
		return "give --endpoint as host:port, such as 203.0.113.7:51820"
	case errors.Is(err, app.ErrPublicNeedsEndpoint):
		return "give --endpoint host:port with --public"
	case errors.Is(err, app.ErrBadTTL):
		return "give --ttl a positive duration such as 24h"
	case errors.Is(err, app.ErrRestoreNotEmpty):
		return "give --data a new or empty directory: a restore never mixes with stores already there"
	case errors.Is(err, app.ErrBackupOtherKey):
		return "give the operator key that was set when the backup was made"
	case errors.Is(err, app.ErrNotABackup):
		return "give a file 'mesh-controller store backup' or 'serve --backup-every' wrote"
	case errors.Is(err, sqlite.ErrCopyIncomplete):
		return "run 'mesh-controller store backup' again; if it recurs, report it"
	case errors.Is(err, app.ErrBackupDamaged), errors.Is(err, sqlite.ErrIntegrity):
		return "restore another backup ('serve --backup-every' keeps the newest few in --backup-dir)"
	case isStore:
		return fmt.Sprintf("check %s and the data dir", se.Location.Var)
	}
	return ""
}
