//! The engine over a local-directory bucket, whose small objects live in a journal for a while
//! before they become files (docs/0002-local-journal.md): a reader beside the writer must still
//! see a whole, consistent state.

use bucketfs_engine::bucket::{open_url, SharedBucket};
use bucketfs_engine::{Engine, EngineOptions};

mod common;
use common::flush_past_a_checkpoint;

fn bucket(dir: &std::path::Path) -> SharedBucket {
    open_url(&format!("file://{}", dir.display()), &Vec::new()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_beside_the_writer_sees_what_is_only_in_the_journal() {
    let dir = std::env::temp_dir().join(format!("bucketfs-reader-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let e = Engine::open(bucket(&dir), EngineOptions::for_tests("pw"))
        .await
        .unwrap();
    // Enough flushes for a checkpoint, which collects most log objects before they are files.
    flush_past_a_checkpoint(&e, 5).await;
    let files = std::fs::read_dir(dir.join("log")).map_or(0, |d| d.count());
    assert!(
        files < 10,
        "young log objects stay in the journal, and collected ones never become files ({files} files)"
    );
    let expect = e.read(1, 0, 5 * 4096).await.unwrap();

    let mut opts = EngineOptions::for_tests("pw");
    opts.read_only = true;
    let reader = Engine::open(bucket(&dir), opts).await.unwrap();
    let seen = reader.read(1, 0, 5 * 4096).await.unwrap();
    assert!(seen == expect, "the reader sees what the writer flushed");

    // A clean stop leaves every object a file: a reader then needs no journal.
    e.close().await.unwrap();
    drop(e);
    let files = std::fs::read_dir(dir.join("log")).unwrap().count();
    assert!(files > 0);
    std::fs::remove_file(dir.join(".journal")).unwrap();
    let mut opts = EngineOptions::for_tests("pw");
    opts.read_only = true;
    let reader = Engine::open(bucket(&dir), opts).await.unwrap();
    let seen = reader.read(1, 0, 5 * 4096).await.unwrap();
    assert!(
        seen == expect,
        "the files alone hold everything after a clean stop"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
