//! The PostgreSQL sink's transactions against a real server, driven step by step: a barrier
//! prepares the rows written since the last one, the checkpoint's completion commits them, a
//! repeated commit is a success, and a prepared transaction rolled back behind the sink's back
//! fails the commit naming it; upserts keep the last row of each key, staged until their
//! checkpoint completes; old markers are deleted; a renamed job rolls back what its old
//! name left; a server without prepared transactions is refused.

// The control crate's cluster; this test restarts none.
#[allow(dead_code)]
#[path = "../../control/tests/common/postgres.rs"]
mod postgres_cluster;

use std::future::Future;
use std::time::Duration;

use futures::future::Either;
use postgres_cluster::Cluster;
use weir_engine::checkpoint::CheckpointBarrier;
use weir_engine::connector::{DeliveryGuarantee, PgType, PostgresSink, SinkWriter};
use weir_engine::prelude::*;
use weir_engine::state::OperatorListState;
use weir_engine::NO_TIMESTAMP;

fn sink(cluster: &Cluster) -> PostgresSink<u64> {
    sink_at(&cluster.url())
}

fn sink_at(url: &str) -> PostgresSink<u64> {
    PostgresSink::new(url, "numbers", &[("n", PgType::BigInt)], |n, row| {
        row.int(*n as i64);
    })
    .expect("a sink")
}

/// Runs `steps` on a glommio executor with a writer of `sink` (subtask 0 of 1).
fn with_writer(
    sink: PostgresSink<u64>,
    steps: impl FnOnce(Box<dyn SinkWriter<u64>>) -> futures::future::LocalBoxFuture<'static, ()>
        + Send
        + 'static,
) {
    on_executor(move || {
        Box::pin(async move {
            let ctx = RuntimeContext::new("numbers", 0, 1, 128);
            let writer = Sink::create_writer(&sink, &ctx).expect("a writer");
            steps(writer).await;
        })
    });
}

/// Runs `steps` on a glommio executor.
fn on_executor(
    steps: impl FnOnce() -> futures::future::LocalBoxFuture<'static, ()> + Send + 'static,
) {
    glommio::LocalExecutorBuilder::default()
        .spawn(steps)
        .expect("an executor")
        .join()
        .expect("the steps");
}

/// `step`'s output, or a panic naming it after 30 s: a sink that blocks fails the test.
async fn within<T>(what: &str, step: impl Future<Output = T>) -> T {
    let limit = glommio::timer::sleep(Duration::from_secs(30));
    futures::pin_mut!(step, limit);
    match futures::future::select(step, limit).await {
        Either::Left((out, _)) => out,
        Either::Right(_) => panic!("{what} did not finish in 30 s"),
    }
}

/// Waits until `done` holds (a checkpoint's commit runs beside the writer after its notice),
/// or panics naming `what` after 30 s.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    within(what, async {
        while !done() {
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Writes `records` (without timestamps) and passes checkpoint `checkpoint`'s barrier.
async fn write_then_barrier(writer: &mut dyn SinkWriter<u64>, records: &[u64], checkpoint: u64) {
    let mut batch = records.to_vec();
    let timestamps = vec![NO_TIMESTAMP; batch.len()];
    writer.write(&mut batch, &timestamps).await.expect("write");
    writer
        .flush(&CheckpointBarrier::checkpoint(checkpoint))
        .await
        .expect("the barrier");
}

/// What the sink's state holds: the committables a checkpoint of it would keep (the
/// two-phase sinks' union list state).
fn committables(ctx: &RuntimeContext) -> OperatorListState<Vec<u8>> {
    ctx.operator_state()
        .union_list_state(&ListStateDescriptor::<Vec<u8>>::new(
            "two-phase committables",
        ))
        .expect("the committables' state")
}

/// The `numbers` table's rows, in order.
fn numbers(cluster: &Cluster) -> Vec<i64> {
    let rows = cluster
        .client()
        .query("SELECT n FROM numbers ORDER BY n", &[])
        .expect("read");
    rows.iter().map(|row| row.get(0)).collect()
}

fn admin(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).expect("connect")
}

fn count(url: &str, sql: &str) -> i64 {
    admin(url).query_one(sql, &[]).expect(sql).get(0)
}

#[test]
fn a_checkpoint_prepares_then_commits_and_a_rollback_behind_its_back_fails_the_commit() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    cluster.execute("CREATE TABLE numbers (n bigint NOT NULL)");
    let url = cluster.url();
    with_writer(sink(&cluster), move |mut writer| {
        Box::pin(async move {
            let admin = || postgres::Client::connect(&url, postgres::NoTls).expect("connect");
            let rows = |sql: &str| -> i64 { admin().query_one(sql, &[]).expect(sql).get(0) };
            write_then_barrier(&mut *writer, &[1, 2, 3], 1).await;
            assert_eq!(rows("SELECT count(*) FROM pg_prepared_xacts"), 1);
            assert_eq!(
                rows("SELECT count(*) FROM numbers"),
                0,
                "not visible before commit"
            );
            writer.notify_checkpoint_complete(1).await.expect("commit");
            eventually("the commit", || rows("SELECT count(*) FROM numbers") == 3).await;
            // A repeated notice finds nothing more to commit.
            writer
                .notify_checkpoint_complete(1)
                .await
                .expect("nothing to commit");

            write_then_barrier(&mut *writer, &[4], 2).await;
            let gid: String = admin()
                .query_one("SELECT gid FROM pg_prepared_xacts", &[])
                .expect("the prepared transaction")
                .get(0);
            assert!(
                gid.starts_with("weir-") && gid.ends_with("-chk2-job"),
                "the name tells the operator, subtask, checkpoint and job: {gid}"
            );
            admin()
                .batch_execute(&format!("ROLLBACK PREPARED '{gid}'"))
                .expect("roll back behind the sink's back");
            writer
                .notify_checkpoint_complete(2)
                .await
                .expect("the commit runs beside the writer");
            let error = writer.close(false).await.expect_err("the commit failed");
            assert!(
                error.message.contains(&gid) && error.message.contains("rolled back outside Weir"),
                "{}",
                error.message
            );
        })
    });
    assert_eq!(cluster.count("SELECT count(*) FROM numbers"), 3);
}

fn totals_sink(cluster: &Cluster) -> PostgresSink<u64> {
    cluster.execute("CREATE TABLE totals (k integer PRIMARY KEY, total bigint NOT NULL)");
    PostgresSink::new(
        &cluster.url(),
        "totals",
        &[("k", PgType::Integer), ("total", PgType::BigInt)],
        |n: &u64, row| {
            row.int((n % 3) as i64).int(*n as i64);
        },
    )
    .expect("a sink")
    .upsert(&["k"])
}

fn totals(url: &str) -> Vec<(i32, i64)> {
    admin(url)
        .query("SELECT k, total FROM totals ORDER BY k", &[])
        .expect("read")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// Exactly-once upserts wait in a staging table until their checkpoint completes: nothing of
/// a prepared transaction is visible, the next transaction upserts the same keys without
/// waiting for the first one's row locks, and each completion merges the last row of each key
/// and deletes what it merged.
#[test]
fn upserts_are_staged_until_their_checkpoint_completes() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let sink = totals_sink(&cluster);
    let url = cluster.url();
    with_writer(sink, move |mut writer| {
        Box::pin(async move {
            let staged = || {
                let table: String = admin(&url)
                    .query_one(
                        "SELECT tablename::text FROM pg_tables \
                         WHERE tablename LIKE 'weir\\_staged\\_totals\\_%'",
                        &[],
                    )
                    .expect("one staging table")
                    .get(0);
                count(&url, &format!("SELECT count(*) FROM \"{table}\""))
            };
            let first: Vec<u64> = (0..10).collect();
            write_then_barrier(&mut *writer, &first, 1).await;
            assert_eq!(totals(&url), [], "nothing visible before the commit");
            // The same key (2) again while the first transaction is prepared.
            writer
                .write(&mut vec![11, 14], &[NO_TIMESTAMP; 2])
                .await
                .expect("write");
            within(
                "the second prepare",
                writer.flush(&CheckpointBarrier::checkpoint(2)),
            )
            .await
            .expect("prepare");
            assert_eq!(count(&url, "SELECT count(*) FROM pg_prepared_xacts"), 2);
            writer.notify_checkpoint_complete(1).await.expect("commit");
            eventually("the first merge", || {
                totals(&url) == [(0, 9), (1, 7), (2, 8)]
            })
            .await;
            writer.notify_checkpoint_complete(2).await.expect("commit");
            eventually("the second merge", || {
                totals(&url) == [(0, 9), (1, 7), (2, 14)]
            })
            .await;
            assert_eq!(staged(), 0, "a merge deletes what it merged");
            writer
                .write(&mut vec![15], &[NO_TIMESTAMP])
                .await
                .expect("write");
            writer.finish().await.expect("finish");
            writer.close(false).await.expect("commit at the end");
            assert_eq!(totals(&url), [(0, 15), (1, 7), (2, 14)]);
            assert_eq!(staged(), 0);
        })
    });
    assert_eq!(cluster.count("SELECT count(*) FROM pg_prepared_xacts"), 0);
}

/// A restore commits each old subtask's transactions on one new subtask, in their order: two
/// upserts of one key that one subtask staged at two barriers merge the later one last,
/// whichever new subtask restores first; a transaction committed before the crash but not
/// merged (its committer died between the two) is merged by the restore.
#[test]
fn restored_upserts_merge_in_the_order_their_writer_staged_them() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let sink = std::sync::Arc::new(totals_sink(&cluster));
    let url = cluster.url();
    on_executor(move || {
        Box::pin(async move {
            let ctx = RuntimeContext::new("totals", 0, 2, 128);
            let mut writer = Sink::create_writer(&*sink, &ctx).expect("a writer");
            write_then_barrier(&mut *writer, &[2], 1).await;
            write_then_barrier(&mut *writer, &[5], 2).await;
            let held = committables(&ctx).get();
            assert_eq!(held.len(), 2);
            drop(writer);
            let first: String = admin(&url)
                .query_one(
                    "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE '%-chk1-%'",
                    &[],
                )
                .expect("checkpoint 1's transaction")
                .get(0);
            admin(&url)
                .batch_execute(&format!("COMMIT PREPARED '{first}'"))
                .expect("commit without the merge");
            assert_eq!(totals(&url), [], "committed, not merged");
            // Restored at parallelism 2; subtask 1 restores first.
            let mut writers = Vec::new();
            for subtask in [1, 0] {
                let ctx = RuntimeContext::new("totals", subtask, 2, 128);
                committables(&ctx).update(held.clone());
                let mut writer = Sink::create_writer(&*sink, &ctx).expect("a writer");
                writer.write(&mut Vec::new(), &[]).await.expect("restore");
                writers.push(writer);
            }
            assert_eq!(totals(&url), [(2, 5)], "the later upsert merged last");
        })
    });
    assert_eq!(cluster.count("SELECT count(*) FROM pg_prepared_xacts"), 0);
}

/// At least once, upserts go straight into the table at each barrier.
#[test]
fn upserts_at_least_once_keep_the_last_row_of_each_key_across_checkpoints() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let sink = totals_sink(&cluster).with_delivery_guarantee(DeliveryGuarantee::AtLeastOnce);
    let url = cluster.url();
    with_writer(sink, move |mut writer| {
        Box::pin(async move {
            // Keys repeat within a batch and across checkpoints: the last row of each wins.
            let first: Vec<u64> = (0..10).collect();
            write_then_barrier(&mut *writer, &first, 1).await;
            assert_eq!(
                totals(&url),
                [(0, 9), (1, 7), (2, 8)],
                "committed at the barrier"
            );
            writer
                .write(&mut vec![11, 14], &[NO_TIMESTAMP; 2])
                .await
                .expect("write");
            writer.finish().await.expect("finish");
            writer.close(false).await.expect("commit at the end");
            assert_eq!(totals(&url), [(0, 9), (1, 7), (2, 14)]);
        })
    });
    let staging = "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'weir\\_staged%'";
    assert_eq!(cluster.count(staging), 0, "no staging at least once");
}

/// Markers older than `sink.postgres.transaction-marker-retention` are deleted; a restore
/// that recommits a transaction whose marker is gone takes it as committed, and writes
/// nothing twice.
#[test]
fn old_markers_are_deleted_and_a_restore_past_them_takes_the_transaction_as_committed() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    cluster.execute("CREATE TABLE numbers (n bigint NOT NULL)");
    let url = cluster.url();
    on_executor(move || {
        Box::pin(async move {
            let mut ctx = RuntimeContext::new("numbers", 0, 1, 128);
            ctx.sinks.marker_retention = Duration::from_secs(1);
            let markers = |url: &str| count(url, "SELECT count(*) FROM weir_sink_transactions");
            let mut writer = Sink::create_writer(&sink_at(&url), &ctx).expect("a writer");
            write_then_barrier(&mut *writer, &[1], 1).await;
            writer.notify_checkpoint_complete(1).await.expect("commit");
            eventually("the commit", || markers(&url) == 1).await;
            // Killed after the commit: a restore of checkpoint 1 commits its transaction again.
            let checkpoint_1 = committables(&ctx).get();
            drop(writer);
            glommio::timer::sleep(Duration::from_millis(1500)).await;
            let mut writer = Sink::create_writer(&sink_at(&url), &ctx).expect("a writer");
            write_then_barrier(&mut *writer, &[2], 2).await;
            writer.notify_checkpoint_complete(2).await.expect("commit");
            let chk2 = "SELECT count(*) FROM weir_sink_transactions WHERE gid LIKE '%-chk2-%'";
            // Checkpoint 1's marker, 1.5 s old, is deleted after checkpoint 2 commits.
            let only_chk2 = || count(&url, chk2) == 1 && markers(&url) == 1;
            eventually("the commit and the deletion", only_chk2).await;
            drop(writer);
            committables(&ctx).update(checkpoint_1);
            let mut writer = Sink::create_writer(&sink_at(&url), &ctx).expect("a writer");
            // Its first write recommits checkpoint 1's transaction.
            write_then_barrier(&mut *writer, &[3], 3).await;
            writer.notify_checkpoint_complete(3).await.expect("commit");
            writer.close(false).await.expect("the commit returns");
        })
    });
    assert_eq!(numbers(&cluster), [1, 2, 3]);
}

/// A job restored under another name rolls back what its old name left prepared (the
/// checkpoint keeps the old name prefix), and commits what the checkpoint holds.
#[test]
fn a_renamed_job_rolls_back_what_its_old_name_left() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    cluster.execute("CREATE TABLE numbers (n bigint NOT NULL)");
    let url = cluster.url();
    on_executor(move || {
        Box::pin(async move {
            let ctx = RuntimeContext::new("numbers", 0, 1, 128);
            let mut writer = Sink::create_writer(&sink_at(&url), &ctx).expect("a writer");
            write_then_barrier(&mut *writer, &[1], 1).await;
            let checkpoint_1 = committables(&ctx).get();
            write_then_barrier(&mut *writer, &[2], 2).await;
            // Killed before checkpoint 2 completed; restored from checkpoint 1, renamed.
            drop(writer);
            assert_eq!(count(&url, "SELECT count(*) FROM pg_prepared_xacts"), 2);
            committables(&ctx).update(checkpoint_1);
            let mut renamed = ctx.clone();
            renamed.job_name = "renamed".into();
            let mut writer = Sink::create_writer(&sink_at(&url), &renamed).expect("a writer");
            // Its first write restores: commits checkpoint 1's, rolls back the rest.
            write_then_barrier(&mut *writer, &[3], 2).await;
            let left: Vec<String> = admin(&url)
                .query("SELECT gid FROM pg_prepared_xacts", &[])
                .expect("read")
                .iter()
                .map(|row| row.get(0))
                .collect();
            assert!(
                left.len() == 1 && left[0].ends_with("-chk2-renamed"),
                "only the renamed job's own transaction is left: {left:?}"
            );
            writer.notify_checkpoint_complete(2).await.expect("commit");
            writer.close(false).await.expect("the commit returns");
        })
    });
    assert_eq!(numbers(&cluster), [1, 3]);
    assert_eq!(cluster.count("SELECT count(*) FROM pg_prepared_xacts"), 0);
}

/// A server that cannot prepare transactions fails the job before its first write, saying so.
#[test]
fn a_server_without_prepared_transactions_is_refused() {
    let Some(cluster) = Cluster::start_with_prepared(0) else {
        return;
    };
    cluster.execute("CREATE TABLE numbers (n bigint NOT NULL)");
    with_writer(sink(&cluster), |mut writer| {
        Box::pin(async move {
            let error = writer
                .write(&mut vec![1], &[NO_TIMESTAMP])
                .await
                .expect_err("refused before the first write");
            assert!(error.bad_input, "no restart helps: {}", error.message);
            assert!(
                error.message.contains("max_prepared_transactions = 0")
                    && error.message.contains("postgresql.conf"),
                "{}",
                error.message
            );
        })
    });
    assert_eq!(cluster.count("SELECT count(*) FROM numbers"), 0);
}
