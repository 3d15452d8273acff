//! `/metrics`: the server's counters and latency histograms in Prometheus' text exposition
//! format (version 0.0.4), served over HTTP on `admin.metrics_listen` and printed by `bucketfs
//! metrics` through the admin socket (docs/0008-metrics.md). The engine keeps the numbers in
//! atomics (bucketfs_engine::histogram); a scrape reads them once and writes them out with the
//! Prometheus project's client library.

use bucketfs_engine::bucket::{CountingBucket, JournalBacklog, JournaledBucket, OpStats, StoreOp};
use bucketfs_engine::histogram::{HistogramSnapshot, BUCKET_BOUNDS_US};
use bucketfs_engine::limits::EXTENT_SIZE_BYTES_U64;
use bucketfs_engine::{BarrierLatency, Engine, EngineStats};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// The `Content-Type` of the text format.
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Scrapes served at once: a Prometheus server or two and someone with curl. More connections
/// are closed at once rather than queued, so that a flood costs the server nothing but accepts.
const CONNECTIONS_MAX: usize = 8;
/// A client must send its request headers within this long, or its connection is closed.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything one scrape shows, read at once.
#[derive(Debug)]
pub struct Sample {
    pub store: [OpStats; StoreOp::ALL.len()],
    pub barriers: BarrierLatency,
    pub engine: EngineStats,
    pub journal: JournalBacklog,
}

impl Sample {
    pub fn take(store: &CountingBucket, engine: &Engine, journal: &JournaledBucket) -> Sample {
        Sample {
            store: store.op_stats(),
            barriers: engine.barrier_latency(),
            engine: engine.stats(),
            journal: journal.backlog(),
        }
    }

    /// The text of a scrape.
    pub fn render(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// Writes a histogram of microseconds in seconds, Prometheus' unit of time.
fn histogram(metric: &mut MetricEncoder, h: &HistogramSnapshot) -> fmt::Result {
    let buckets: Vec<(f64, u64)> = BUCKET_BOUNDS_US
        .iter()
        .map(|&us| us as f64 / 1e6)
        .zip(h.counts)
        .collect();
    // The last bucket, above every bound, is `+Inf`: the encoder writes it from the count.
    metric.encode_histogram::<NoLabelSet>(h.sum_us as f64 / 1e6, h.count(), &buckets, None)
}

fn counter(metric: &mut MetricEncoder, value: u64) -> fmt::Result {
    metric.encode_counter::<NoLabelSet, _, u64>(&value, None)
}

fn gauge(metric: &mut MetricEncoder, value: u64) -> fmt::Result {
    metric.encode_gauge(&value)
}

/// One metric family: its name, help, type, and a value per label set (written by `each`).
fn family<V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    label: &str,
    values: &[(&str, V)],
    each: impl Fn(&mut MetricEncoder, &V) -> fmt::Result,
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (label_value, value) in values {
        let labels = [(label, *label_value)];
        each(&mut metric.encode_family(&labels)?, value)?;
    }
    Ok(())
}

/// One metric without labels.
fn single(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    each: impl FnOnce(&mut MetricEncoder) -> fmt::Result,
) -> fmt::Result {
    each(&mut encoder.encode_descriptor(name, help, None, kind)?)
}

impl Collector for Sample {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        use MetricType::{Counter, Gauge, Histogram};
        let e = &mut encoder;
        let ops = |f: fn(&OpStats) -> u64| -> Vec<(&str, u64)> {
            self.store.iter().map(|o| (o.op.name(), f(o))).collect()
        };
        family(
            e,
            "bucketfs_object_store_requests",
            "Object-store requests, per operation; every attempt counts, retries included.",
            Counter,
            "op",
            &ops(|o| o.requests),
            |m, v| counter(m, *v),
        )?;
        family(
            e,
            "bucketfs_object_store_errors",
            "Object-store requests that failed (a missing object is an answer, not a failure).",
            Counter,
            "op",
            &ops(|o| o.errors),
            |m, v| counter(m, *v),
        )?;
        let moving = ops(|o| o.bytes);
        let moving: Vec<_> = moving
            .into_iter()
            .filter(|(op, _)| {
                [StoreOp::Put, StoreOp::Get, StoreOp::GetRange]
                    .map(StoreOp::name)
                    .contains(op)
            })
            .collect();
        family(
            e,
            "bucketfs_object_store_bytes",
            "Bytes sent to the object store (put) or received from it (get, get_range).",
            Counter,
            "op",
            &moving,
            |m, v| counter(m, *v),
        )?;
        let latencies: Vec<(&str, HistogramSnapshot)> = self
            .store
            .iter()
            .map(|o| (o.op.name(), o.latency))
            .collect();
        family(
            e,
            "bucketfs_object_store_request_duration_seconds",
            "Time from an object-store request to its answer, per operation, failures included.",
            Histogram,
            "op",
            &latencies,
            histogram,
        )?;

        single(
            e,
            "bucketfs_barrier_duration_seconds",
            "Flush barriers clients asked for (NBD FLUSH and FUA, 9P fsync, NFS COMMIT, admin \
             changes), from the call to its return; the engine's own barriers are not in it.",
            Histogram,
            |m| histogram(m, &self.barriers.whole),
        )?;
        let parts: Vec<(&str, HistogramSnapshot)> = self
            .barriers
            .parts
            .iter()
            .map(|(part, h)| (part.name(), *h))
            .collect();
        family(
            e,
            "bucketfs_barrier_part_duration_seconds",
            "Time a client barrier spent in each of its parts, one observation per part and \
             barrier (zero for a part it did not go through): checkpoint_hold, seal_wait, seal, \
             upload_wait, put, commit, outage_wait (docs/0008-metrics.md).",
            Histogram,
            "part",
            &parts,
            histogram,
        )?;

        let s = &self.engine;
        family(
            e,
            "bucketfs_cache_hits",
            "Lookups a cache tier answered: memory (extents read without a fetch), disk (frames \
             read from cache.dir instead of the bucket), metadata (decoded run blocks).",
            Counter,
            "tier",
            &[
                ("memory", s.memory_cache_hits),
                ("disk", s.disk_cache_hits),
                ("metadata", s.metadata_cache_hits),
            ],
            |m, v| counter(m, *v),
        )?;
        family(
            e,
            "bucketfs_cache_misses",
            "Lookups a cache tier could not answer (see bucketfs_cache_hits).",
            Counter,
            "tier",
            &[
                ("memory", s.memory_cache_misses),
                ("disk", s.disk_cache_misses),
                ("metadata", s.metadata_cache_misses),
            ],
            |m, v| counter(m, *v),
        )?;
        family(
            e,
            "bucketfs_cache_bytes",
            "What each cache tier holds: memory (decoded extents), disk (stored bytes), \
             metadata (decoded run blocks).",
            Gauge,
            "tier",
            &[
                ("memory", s.memory_cache_extents * EXTENT_SIZE_BYTES_U64),
                ("disk", s.disk_cache_bytes),
                ("metadata", s.metadata_cache_bytes),
            ],
            |m, v| gauge(m, *v),
        )?;

        family(
            e,
            "bucketfs_scoped_barriers",
            "fsyncs of one file (docs/0006, Durability), by how they were made durable: a side record, the full barrier, or nothing of the file unflushed.",
            Counter,
            "path",
            &[
                ("side_record", s.scoped_barriers_side),
                ("full", s.scoped_barriers_full),
                ("clean", s.scoped_barriers_clean),
            ],
            |m, v| counter(m, *v),
        )?;

        let counters = [
            (
                "bucketfs_barriers",
                "Flush barriers, the clients' and the engine's own (periodic, memory pressure).",
                s.barriers,
            ),
            (
                "bucketfs_flushes",
                "Batches sealed into log objects.",
                s.flushes,
            ),
            (
                "bucketfs_write_behind_flushes",
                "Flushes started by write-behind, ahead of the barrier that will ask for them.",
                s.write_behind_flushes,
            ),
            (
                "bucketfs_log_objects_written",
                "Log objects stored and committed.",
                s.log_objects_written,
            ),
            (
                "bucketfs_log_bytes_written",
                "Bytes of the log objects stored and committed.",
                s.log_bytes_written,
            ),
            (
                "bucketfs_checkpoints_written",
                "Checkpoints of the metadata written.",
                s.checkpoints_written,
            ),
            (
                "bucketfs_side_record_extents_left_out",
                "Extents a side record of an fsync left out because the file's earlier side record holds them (docs/0006, Durability).",
                s.side_record_extents_left_out,
            ),
        ];
        for (name, help, value) in counters {
            single(e, name, help, Counter, |m| counter(m, value))?;
        }
        let j = &self.journal;
        let gauges = [
            (
                "bucketfs_pending_bytes",
                "File data written and not yet sealed into a log object.",
                s.pending_bytes,
            ),
            (
                "bucketfs_upload_queue_objects",
                "Sealed log objects not yet stored in the bucket.",
                s.upload_queue_objects,
            ),
            (
                "bucketfs_upload_queue_bytes",
                "Bytes of the sealed log objects not yet stored in the bucket.",
                s.upload_queue_bytes,
            ),
            (
                "bucketfs_log_objects_since_checkpoint",
                "Log objects committed since the newest checkpoint began: what an open would \
                 replay.",
                s.log_objects_since_checkpoint,
            ),
            (
                "bucketfs_journal_backlog_objects",
                "Changes acknowledged by the journal tier ([storage.journal]) and not yet in the \
                 bucket (0 without a journal).",
                j.objects,
            ),
            (
                "bucketfs_journal_backlog_bytes",
                "Bytes of the objects acknowledged by the journal tier and not yet in the bucket.",
                j.bytes,
            ),
        ];
        for (name, help, value) in gauges {
            single(e, name, help, Gauge, |m| gauge(m, value))?;
        }
        single(
            e,
            "bucketfs_journal_backlog_seconds",
            "Age of the oldest change acknowledged by the journal tier and not yet in the bucket.",
            Gauge,
            |m| m.encode_gauge(&j.oldest.as_secs_f64()),
        )?;
        Ok(())
    }
}

/// Serves GET /metrics on `listener` forever; `sample` takes a scrape's numbers.
pub async fn serve(listener: TcpListener, sample: Arc<dyn Fn() -> Sample + Send + Sync>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics: {CONNECTIONS_MAX} connections open; closing another");
            continue;
        };
        let sample = sample.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let sample = sample.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&request, &*sample)) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%peer, %error, "metrics connection ended");
            }
            drop(slot);
        });
    }
}

/// GET (or HEAD) /metrics; anything else is answered with its error.
fn answer<B>(request: &Request<B>, sample: &dyn Fn() -> Sample) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, text: &'static str| {
        Response::builder()
            .status(status)
            .header(hyper::header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from_static(text.as_bytes())))
            .expect("a static response is valid")
    };
    if request.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n",
        );
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut refused = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET /metrics\n");
        refused.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return refused;
    }
    Response::builder()
        .header(hyper::header::CONTENT_TYPE, CONTENT_TYPE)
        .body(Full::new(Bytes::from(sample().render())))
        .expect("a response of text is valid")
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucketfs_engine::histogram::{Histogram, BUCKETS};
    use bucketfs_engine::BarrierPart;

    fn sample() -> Sample {
        let timed = |us: &[u64]| {
            let h = Histogram::default();
            for &us in us {
                h.record_us(us);
            }
            h.snapshot()
        };
        let mut store = StoreOp::ALL.map(|op| OpStats {
            op,
            requests: 0,
            errors: 0,
            bytes: 0,
            latency: HistogramSnapshot::default(),
        });
        store[StoreOp::Put as usize] = OpStats {
            op: StoreOp::Put,
            requests: 3,
            errors: 1,
            bytes: 12_345,
            latency: timed(&[20_000, 21_000, 45_000]),
        };
        let mut parts = BarrierPart::ALL.map(|part| (part, timed(&[0, 0])));
        parts[BarrierPart::Put as usize].1 = timed(&[21_000, 0]);
        Sample {
            store,
            barriers: BarrierLatency {
                whole: timed(&[21_500, 150]),
                parts,
            },
            engine: EngineStats {
                memory_cache_hits: 7,
                disk_cache_misses: 2,
                memory_cache_extents: 3,
                pending_bytes: 4096,
                ..EngineStats::default()
            },
            journal: JournalBacklog {
                objects: 2,
                bytes: 8192,
                oldest: Duration::from_millis(1500),
            },
        }
    }

    fn lines_of<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| l.split(['{', ' ']).next() == Some(name))
            .collect()
    }

    #[test]
    fn the_text_has_the_names_labels_and_buckets_prometheus_reads() {
        let text = sample().render();
        let has = |line: &str| assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        has("# TYPE bucketfs_object_store_requests_total counter");
        has("bucketfs_scoped_barriers_total{path=\"side_record\"} 0");
        has("bucketfs_object_store_requests_total{op=\"put\"} 3");
        has("bucketfs_object_store_requests_total{op=\"get_range\"} 0");
        has("bucketfs_object_store_errors_total{op=\"put\"} 1");
        has("bucketfs_object_store_bytes_total{op=\"put\"} 12345");
        assert!(lines_of(&text, "bucketfs_object_store_bytes_total")
            .iter()
            .all(|l| !l.contains("\"list\"") && !l.contains("\"delete\"")));

        // A histogram: cumulative buckets in seconds, +Inf equal to the count, the sum.
        has("# TYPE bucketfs_object_store_request_duration_seconds histogram");
        let put = "bucketfs_object_store_request_duration_seconds_bucket{op=\"put\",";
        has(&format!("{put}le=\"0.015\"}} 0"));
        has(&format!("{put}le=\"0.02\"}} 1"));
        has(&format!("{put}le=\"0.03\"}} 2"));
        has(&format!("{put}le=\"0.05\"}} 3"));
        has(&format!("{put}le=\"10\"}} 3"));
        has(&format!("{put}le=\"+Inf\"}} 3"));
        has("bucketfs_object_store_request_duration_seconds_sum{op=\"put\"} 0.086");
        has("bucketfs_object_store_request_duration_seconds_count{op=\"put\"} 3");
        let put_buckets: Vec<_> = text.lines().filter(|l| l.starts_with(put)).collect();
        assert_eq!(put_buckets.len(), BUCKETS, "every bound and +Inf");
        has("bucketfs_object_store_request_duration_seconds_bucket{op=\"get\",le=\"1e-05\"} 0");

        has("# TYPE bucketfs_barrier_duration_seconds histogram");
        has("bucketfs_barrier_duration_seconds_bucket{le=\"0.0002\"} 1");
        has("bucketfs_barrier_duration_seconds_bucket{le=\"0.03\"} 2");
        has("bucketfs_barrier_duration_seconds_count 2");
        has("bucketfs_barrier_duration_seconds_sum 0.02165");
        for part in BarrierPart::ALL {
            has(&format!(
                "bucketfs_barrier_part_duration_seconds_count{{part=\"{}\"}} 2",
                part.name()
            ));
        }
        has("bucketfs_barrier_part_duration_seconds_bucket{part=\"put\",le=\"1e-05\"} 1");
        has("bucketfs_barrier_part_duration_seconds_bucket{part=\"put\",le=\"0.03\"} 2");
        has("bucketfs_barrier_part_duration_seconds_sum{part=\"put\"} 0.021");

        has("bucketfs_cache_hits_total{tier=\"memory\"} 7");
        has("bucketfs_cache_misses_total{tier=\"disk\"} 2");
        has("bucketfs_cache_bytes{tier=\"memory\"} 24576");
        has("# TYPE bucketfs_pending_bytes gauge");
        has("bucketfs_pending_bytes 4096");
        has("# TYPE bucketfs_journal_backlog_bytes gauge");
        has("bucketfs_journal_backlog_bytes 8192");
        has("bucketfs_journal_backlog_seconds 1.5");

        // Every family is described once, before its samples, and every sample line is
        // `name{labels} value`.
        let mut described = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert!(!described.contains(&name), "{name} described twice");
                described.push(name);
            } else if !line.starts_with("# HELP ") {
                let name = line.split(['{', ' ']).next().unwrap();
                assert!(
                    described.iter().any(|d| name == *d
                        || ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|s| name.strip_suffix(s) == Some(d))),
                    "{line:?} comes before its TYPE"
                );
                let value = line.rsplit(' ').next().unwrap();
                assert!(value.parse::<f64>().is_ok(), "{line:?}");
            }
        }
    }

    #[test]
    fn only_get_and_head_of_metrics_are_answered() {
        let sample = || super::tests::sample();
        let request = |method: Method, path: &str| {
            Request::builder()
                .method(method)
                .uri(path)
                .body(())
                .unwrap()
        };
        let ok = answer(&request(Method::GET, "/metrics"), &sample);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()[hyper::header::CONTENT_TYPE], CONTENT_TYPE);
        assert_eq!(
            answer(&request(Method::GET, "/"), &sample).status(),
            StatusCode::NOT_FOUND
        );
        let post = answer(&request(Method::POST, "/metrics"), &sample);
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(post.headers()[hyper::header::ALLOW], "GET, HEAD");
    }
}
