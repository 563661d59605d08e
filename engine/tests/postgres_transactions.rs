//! The PostgreSQL sink's transactions against a real server, driven step by step: a barrier
//! prepares the rows written since the last one, the checkpoint's completion commits them, a
//! repeated commit is a success, and a prepared transaction rolled back behind the sink's back
//! fails the commit naming it; upserts keep the last row of each key.

// The control crate's cluster; this test restarts none.
#[allow(dead_code)]
#[path = "../../control/tests/common/postgres.rs"]
mod postgres_cluster;

use postgres_cluster::Cluster;
use weir_engine::checkpoint::CheckpointBarrier;
use weir_engine::connector::{PgType, PostgresSink, SinkWriter};
use weir_engine::prelude::*;
use weir_engine::NO_TIMESTAMP;

fn sink(cluster: &Cluster) -> PostgresSink<u64> {
    PostgresSink::new(
        &cluster.url(),
        "numbers",
        &[("n", PgType::BigInt)],
        |n, row| {
            row.int(*n as i64);
        },
    )
    .expect("a sink")
}

/// Runs `steps` on a glommio executor with a writer of `sink` (subtask 0 of 1).
fn with_writer(
    sink: PostgresSink<u64>,
    steps: impl FnOnce(Box<dyn SinkWriter<u64>>) -> futures::future::LocalBoxFuture<'static, ()>
        + Send
        + 'static,
) {
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move {
            let ctx = RuntimeContext::new("numbers", 0, 1, 128);
            let writer = Sink::create_writer(&sink, &ctx).expect("a writer");
            steps(writer).await;
        })
        .expect("an executor")
        .join()
        .expect("the steps");
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
            writer
                .write(&mut vec![1, 2, 3], &[NO_TIMESTAMP; 3])
                .await
                .expect("write");
            writer
                .flush(&CheckpointBarrier::checkpoint(1))
                .await
                .expect("prepare");
            assert_eq!(rows("SELECT count(*) FROM pg_prepared_xacts"), 1);
            assert_eq!(
                rows("SELECT count(*) FROM numbers"),
                0,
                "not visible before commit"
            );
            writer.notify_checkpoint_complete(1).await.expect("commit");
            assert_eq!(rows("SELECT count(*) FROM numbers"), 3);
            // A repeated notice finds nothing more to commit.
            writer
                .notify_checkpoint_complete(1)
                .await
                .expect("nothing to commit");

            writer
                .write(&mut vec![4], &[NO_TIMESTAMP])
                .await
                .expect("write");
            writer
                .flush(&CheckpointBarrier::checkpoint(2))
                .await
                .expect("prepare");
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
            let error = writer
                .notify_checkpoint_complete(2)
                .await
                .expect_err("the commit fails");
            assert!(
                error.message.contains(&gid) && error.message.contains("rolled back outside Weir"),
                "{}",
                error.message
            );
        })
    });
    assert_eq!(cluster.count("SELECT count(*) FROM numbers"), 3);
}

#[test]
fn upserts_keep_the_last_row_of_each_key_across_checkpoints() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    cluster.execute("CREATE TABLE totals (k integer PRIMARY KEY, total bigint NOT NULL)");
    let sink = PostgresSink::new(
        &cluster.url(),
        "totals",
        &[("k", PgType::Integer), ("total", PgType::BigInt)],
        |n: &u64, row| {
            row.int((n % 3) as i64).int(*n as i64);
        },
    )
    .expect("a sink")
    .upsert(&["k"]);
    with_writer(sink, |mut writer| {
        Box::pin(async move {
            // Keys repeat within a batch and across checkpoints: the last row of each wins.
            let mut first: Vec<u64> = (0..10).collect();
            writer
                .write(&mut first, &[NO_TIMESTAMP; 10])
                .await
                .expect("write");
            writer
                .flush(&CheckpointBarrier::checkpoint(1))
                .await
                .expect("prepare");
            writer.notify_checkpoint_complete(1).await.expect("commit");
            writer
                .write(&mut vec![11, 14], &[NO_TIMESTAMP; 2])
                .await
                .expect("write");
            writer.finish().await.expect("finish");
            writer.close(false).await.expect("commit at the end");
        })
    });
    let rows: Vec<(i32, i64)> = cluster
        .client()
        .query("SELECT k, total FROM totals ORDER BY k", &[])
        .expect("read")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(rows, [(0, 9), (1, 7), (2, 14)]);
}
