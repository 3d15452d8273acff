//! The engine over a local-directory bucket, whose small objects live in a journal for a while
//! before they become files (docs/0002-local-journal.md): a reader beside the writer must still
//! see a whole, consistent state.

use bucketfs_engine::bucket::{open_url, SharedBucket};
use bucketfs_engine::{Engine, EngineOptions, Fill};

use crate::common::{flush_past_a_checkpoint, ScratchDir};

fn bucket(dir: &std::path::Path) -> SharedBucket {
    open_url(&format!("file://{}", dir.display()), &Vec::new()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_beside_the_writer_sees_what_is_only_in_the_journal() {
    let dir = ScratchDir::new("reader");
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
}

/// Copies a bucket directory as a crash would leave it (its staging files are garbage anyway).
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// The collector deletes dead log objects as garbage: in a local bucket their journal records
/// are zeroed some milliseconds later, so a crash may bring them back (docs/0002, "Deleting
/// garbage"). The engine must open what such a crash leaves as if they had stayed deleted, and
/// delete them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collected_log_objects_that_a_crash_brings_back_are_collected_again() {
    let base = ScratchDir::new("garbage");
    let (dir, crashed) = (base.join("running"), base.join("crashed"));
    let e = Engine::open(bucket(&dir), EngineOptions::for_tests("pw"))
        .await
        .unwrap();
    // Log objects whose blocks the flushes below overwrite, so that the checkpoint's
    // collection deletes them: kept aside, as a crash may keep them.
    for i in 0..20u64 {
        let block = vec![i as u8; 4096];
        e.write(1, (i % 5) * 4096, 4096, Fill::Data(&block))
            .await
            .unwrap();
        e.flush().await.unwrap();
    }
    let beside = bucket(&dir);
    let mut kept = Vec::new();
    for o in beside.list("log/").await.unwrap() {
        kept.push((o.key.clone(), beside.get(&o.key).await.unwrap()));
    }
    assert!(kept.len() >= 20);
    flush_past_a_checkpoint(&e, 5).await;
    let expect = e.read(1, 0, 5 * 4096).await.unwrap();
    // Quiet (the repack after the checkpoint done), then the crash: the files and the journal
    // as they are. The lock's holder, this process, is alive: a restarted server would take
    // the lock over from a dead one, so the copy goes without it.
    let mut last = e.stats();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let now = e.stats();
        if (now.flushes, now.log_objects_deleted) == (last.flushes, last.log_objects_deleted) {
            break;
        }
        last = now;
    }
    copy_dir(&dir, &crashed);
    std::fs::remove_file(crashed.join("writer.lock")).unwrap();
    e.close().await.unwrap();
    drop(e);
    // What the crash brought back: the kept objects, as files.
    let listed: Vec<String> = bucket(&crashed)
        .list("log/")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    std::fs::create_dir_all(crashed.join("log")).unwrap();
    for (key, data) in &kept {
        if !listed.contains(key) {
            std::fs::write(crashed.join(key), data).unwrap();
        }
    }

    let e = Engine::open(bucket(&crashed), EngineOptions::for_tests("pw"))
        .await
        .unwrap();
    assert!(e.read(1, 0, 5 * 4096).await.unwrap() == expect);
    // The next checkpoint finds them dead, as every object it covers, and deletes them.
    flush_past_a_checkpoint(&e, 5).await;
    let mut left: Vec<&String> = kept.iter().map(|(k, _)| k).collect();
    for _ in 0..200 {
        left.retain(|k| crashed.join(k).exists());
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        left.is_empty(),
        "{} of {} still there",
        left.len(),
        kept.len()
    );
    e.close().await.unwrap();
}
