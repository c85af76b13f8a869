-- The sweep's turn is a lease row, not a session advisory lock: behind a transaction pooler
-- (PgBouncer in transaction mode, RDS Proxy's multiplexing) the statements of one client
-- session run on whichever server connection is free, so a session lock taken on one could be
-- "released" on another and stay held by a connection nobody owns (seen through PgBouncer: a
-- second sweep ran beside the first and one advisory lock was left behind), and under RDS Proxy
-- it pins the client's connection. A lease is one row any connection can read and take.
--
-- `until` is the database's clock (the sweepers share it, whatever their own clocks say). A
-- sweep takes the row for a minute and renews it before each batch; a crashed sweep's lapses
-- by itself within a minute, and a sweep that finds its row taken over stops.
CREATE TABLE core.sweep_leases (
    name   text PRIMARY KEY CHECK (length(name) <= 64),
    holder uuid NOT NULL,
    until  timestamptz NOT NULL
);

COMMENT ON TABLE core.sweep_leases IS
    'Whose turn it is to sweep: a sweep takes the row when its until has passed, renews it before each batch, and deletes it when done.';
