CREATE TABLE asks (
    id text NOT NULL,
    repository text NOT NULL,
    ref text NOT NULL DEFAULT ''::text,
    module text NOT NULL DEFAULT ''::text,
    dry_run bigint NOT NULL DEFAULT 0,
    plan_id text NOT NULL DEFAULT ''::text,
    again_of text NOT NULL DEFAULT ''::text,
    state text NOT NULL,
    builder text NOT NULL DEFAULT ''::text,
    asked_at text NOT NULL,
    taken_at text,
    finished_at text,
    tries bigint NOT NULL DEFAULT 0,
    last_try_at text,
    late bigint NOT NULL DEFAULT 0,
    source_commit text NOT NULL DEFAULT ''::text,
    version text NOT NULL DEFAULT ''::text,
    digest text NOT NULL DEFAULT ''::text,
    bytes bigint NOT NULL DEFAULT 0,
    duration_ms double precision NOT NULL DEFAULT 0,
    why text NOT NULL DEFAULT ''::text,
    registered bigint NOT NULL DEFAULT 0,
    allow_older bigint NOT NULL DEFAULT 0,
    commit_at text NOT NULL DEFAULT ''::text,
    unpacked_bytes bigint NOT NULL DEFAULT 0
);
CREATE TABLE fence (
    id bigint NOT NULL,
    generation bigint NOT NULL
);
CREATE TABLE outcome_details (
    id text NOT NULL,
    problems text NOT NULL DEFAULT '[]'::text,
    log_tail text NOT NULL DEFAULT '[]'::text,
    manifest text NOT NULL DEFAULT ''::text
);
CREATE TABLE paused_builders (
    holder text NOT NULL,
    since text NOT NULL,
    why text NOT NULL DEFAULT ''::text
);
CREATE TABLE plan_steps (
    plan text NOT NULL,
    position bigint NOT NULL,
    module text NOT NULL,
    repository text NOT NULL,
    ref text NOT NULL DEFAULT ''::text,
    bases text NOT NULL DEFAULT '[]'::text,
    state text NOT NULL,
    ask text NOT NULL DEFAULT ''::text,
    why text NOT NULL DEFAULT ''::text
);
CREATE TABLE plans (
    id text NOT NULL,
    kind text NOT NULL,
    base text NOT NULL DEFAULT ''::text,
    state text NOT NULL,
    made_at text NOT NULL,
    ended_at text,
    why text NOT NULL DEFAULT ''::text
);
CREATE TABLE schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at text NOT NULL
);
ALTER TABLE asks ADD CONSTRAINT asks_check CHECK (((finished_at IS NULL) = (state = ANY (ARRAY['waiting'::text, 'in-flight'::text]))));
ALTER TABLE asks ADD CONSTRAINT asks_check1 CHECK (((state <> 'in-flight'::text) OR (taken_at IS NOT NULL)));
ALTER TABLE asks ADD CONSTRAINT asks_check2 CHECK (((registered = 0) OR ((state = 'done'::text) AND (dry_run = 0))));
ALTER TABLE asks ADD CONSTRAINT asks_dry_run_check CHECK ((dry_run = ANY (ARRAY[(0)::bigint, (1)::bigint])));
ALTER TABLE asks ADD CONSTRAINT asks_late_check CHECK ((late = ANY (ARRAY[(0)::bigint, (1)::bigint])));
ALTER TABLE asks ADD CONSTRAINT asks_pkey PRIMARY KEY (id);
ALTER TABLE asks ADD CONSTRAINT asks_registered_check CHECK ((registered = ANY (ARRAY[(0)::bigint, (1)::bigint])));
ALTER TABLE asks ADD CONSTRAINT asks_repository_check CHECK ((repository <> ''::text));
ALTER TABLE asks ADD CONSTRAINT asks_state_check CHECK ((state = ANY (ARRAY['waiting'::text, 'in-flight'::text, 'done'::text, 'failed'::text, 'dead'::text, 'superseded'::text, 'cancelled'::text, 'killed'::text])));
ALTER TABLE fence ADD CONSTRAINT fence_id_check CHECK ((id = 1));
ALTER TABLE fence ADD CONSTRAINT fence_pkey PRIMARY KEY (id);
ALTER TABLE outcome_details ADD CONSTRAINT outcome_details_id_fkey FOREIGN KEY (id) REFERENCES asks(id) ON DELETE CASCADE;
ALTER TABLE outcome_details ADD CONSTRAINT outcome_details_pkey PRIMARY KEY (id);
ALTER TABLE paused_builders ADD CONSTRAINT paused_builders_holder_check CHECK ((holder <> ''::text));
ALTER TABLE paused_builders ADD CONSTRAINT paused_builders_pkey PRIMARY KEY (holder);
ALTER TABLE plan_steps ADD CONSTRAINT plan_steps_check CHECK (((state = ANY (ARRAY['waiting'::text, 'stopped'::text])) OR (ask <> ''::text)));
ALTER TABLE plan_steps ADD CONSTRAINT plan_steps_module_check CHECK ((module <> ''::text));
ALTER TABLE plan_steps ADD CONSTRAINT plan_steps_pkey PRIMARY KEY (plan, "position");
ALTER TABLE plan_steps ADD CONSTRAINT plan_steps_plan_fkey FOREIGN KEY (plan) REFERENCES plans(id) ON DELETE CASCADE;
ALTER TABLE plan_steps ADD CONSTRAINT plan_steps_plan_module_key UNIQUE (plan, module);
ALTER TABLE plan_steps ADD CONSTRAINT plan_steps_position_check CHECK (("position" >= 0));
ALTER TABLE plan_steps ADD CONSTRAINT plan_steps_repository_check CHECK ((repository <> ''::text));
ALTER TABLE plan_steps ADD CONSTRAINT plan_steps_state_check CHECK ((state = ANY (ARRAY['waiting'::text, 'asked'::text, 'done'::text, 'failed'::text, 'stopped'::text])));
ALTER TABLE plans ADD CONSTRAINT plans_check CHECK (((ended_at IS NULL) = (state = 'running'::text)));
ALTER TABLE plans ADD CONSTRAINT plans_kind_check CHECK ((kind = ANY (ARRAY['behind'::text, 'on'::text])));
ALTER TABLE plans ADD CONSTRAINT plans_pkey PRIMARY KEY (id);
ALTER TABLE plans ADD CONSTRAINT plans_state_check CHECK ((state = ANY (ARRAY['running'::text, 'done'::text, 'failed'::text, 'stopped'::text, 'closed'::text])));
ALTER TABLE schema_migrations ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);
CREATE INDEX asks_asked ON public.asks USING btree (asked_at, id);
CREATE INDEX asks_module ON public.asks USING btree (module, asked_at, id);
CREATE INDEX asks_state ON public.asks USING btree (state, asked_at, id);
CREATE INDEX plans_made ON public.plans USING btree (made_at, id);
CREATE INDEX plans_state ON public.plans USING btree (state, made_at, id);
