// Apache Flink as a peer of `weir compare async`, `weir compare exchange` and
// `weir compare remote`, of Weir's checkpoints, and of Weir's main job (`weir run`).
//
// Runs the same configurations as those suites as Flink DataStream jobs on an
// in-process MiniCluster (started once, reused by every job), and writes the same JSON
// as `weir compare --json`. Built and run by scripts/flink-peer.sh against the jars of
// the `apache-flink-libraries` package.
//
// - async: fromSequence → AsyncDataStream.orderedWait / unorderedWait (capacity C, no
//   timeout) → sink, parallelism 1, all chained in one task. Latency 0 completes inside
//   asyncInvoke; "completed on another thread" hands each call through a bounded
//   single-producer/single-consumer array queue to one dedicated completer thread per
//   function instance (started in open(), daemon, stopped and joined in close()), which
//   busy-polls the queue (Thread.onSpinWait() 64 times, then Thread.yield(), and a
//   50 µs park only after some 10,000 empty polls in a row) and completes each call, as
//   Weir's side has one spinning completer thread behind an SPSC ring; latency L
//   completes from a ScheduledExecutorService L after asyncInvoke.
// - exchange: DataGeneratorSource of N-byte records → rebalance or keyBy → sink, with
//   the producers' and consumers' parallelism and the buffer timeout of Weir's case.
// - remote: the exchange job on a MiniCluster of 2 task managers with P slots each
//   (P = the producers' parallelism = the consumers'), the source in slot sharing group
//   "producers" and the sink in "consumers", so that all P producers fill one task
//   manager and all P consumers the other and every record crosses Flink's Netty
//   network stack (credit-based, over loopback TCP) between the two. After each run the
//   placement is read back from the job's archived execution graph (the task manager of
//   every subtask's execution attempt); a run whose producers and consumers share a
//   task manager is discarded and run again, and the JSON records the placement.
// - checkpoints: DataGeneratorSource of N 64-byte records carrying their sequence
//   number (parallelism 2) → keyBy(sequence number) → a sink (parallelism 2) that counts
//   records and sums sequence numbers and keeps {count, sum} as its writer state.
//   "checkpoint overhead": without checkpoints, with aligned and with unaligned
//   checkpoints every 1 s, N such that a run lasts some 3 s; "checkpoints under
//   back-pressure": the sink busy-waits 20 µs per record (a System.nanoTime spin), the
//   source runs unthrottled so that the network buffers fill, N = 2 sinks × 50,000
//   records/s × 6 s, checkpoints every 1 s, aligned, unaligned, and aligned with buffer
//   debloating (taskmanager.network.memory.buffer-debloat.enabled, a task manager
//   setting: a second MiniCluster of the same shape, up beside the first so that all
//   cases still run in turn each round). Checkpointing: HashMapStateBackend,
//   checkpoint storage on the local filesystem (file://, a fresh temp directory per run,
//   deleted once Flink has discarded the run's checkpoints), EXACTLY_ONCE, at most 1
//   concurrent checkpoint, no aligned-checkpoint timeout. Below full size (--quick) the
//   interval is 100 ms so that the shorter runs still checkpoint; the JSON says which. After each run the checkpoint statistics are read
//   from the finished job's archived execution graph (CheckpointStatsSnapshot, history
//   of 1000): completed and failed counts (and the failures' messages), and per
//   completed checkpoint its end-to-end duration (trigger to last acknowledgement), the
//   largest checkpoint start delay (trigger to a subtask's first barrier) and alignment
//   duration (first to last barrier) of any subtask, the in-flight data persisted
//   (unaligned) and the state size; the JSON gives p50 and max over all checkpoints of
//   the measured runs. Flink reports these in whole milliseconds.
// - keyed: 10 MB, 100 MB and 1 GB of keyed state in one subtask (a ValueState<byte[92]>
//   per Long key, HashMapStateBackend): DataGeneratorSource (the keys once, then 1% of
//   them a second) → keyBy → KeyedProcessFunction, aligned checkpoints every 1 s; per
//   checkpoint of the whole state the subtask's synchronous part (the task's pause), its
//   asynchronous part and the end-to-end duration (keyedSnapshots).
// - mainjob: the job of `weir run`, against Weir's lookup service running apart
//   (`weir serve-lookup`, --lookup-addr): DataGeneratorSource (records {id, key,
//   created_ns}, key = splitmix64(id) mod 1,000,000, unthrottled, parallelism 2) →
//   AsyncDataStream.unorderedWait(timeout 1 s, capacity C, default 1000) with a
//   RichAsyncFunction (LookupFunction: one pipelined TCP connection per subtask, writes
//   batched and reads done by one NIO I/O thread per subtask; see its comment) → keyBy(key)
//   → a sink (parallelism 2) that counts records, marks every id in a bitset (unique,
//   duplicated, lost) and records each record's latency, sink arrival − created_ns;
//   buffer timeout 1 ms (Flink sets it in whole milliseconds; the report runs
//   `weir run --buffer-timeout 1ms` beside it). First 2 JVM warm-up runs (at least
//   1,000,000 records each), then per round one warm-up run (a fifth of the records) and
//   the measured run, all on one MiniCluster started once; each row is one
//   measured round (throughput over the window below, exact latency percentiles over
//   every record, process CPU per record), and "median" has the medians over the rounds.
//
// Every job is configured for throughput as Flink's documentation describes: object
// reuse on, no checkpointing (outside the checkpoints suite), streaming mode, 128 MiB of
// network memory, 32 KiB segments (the default, as Weir's). Each measured run excludes
// start-up: its time is from the first record entering the job (first asyncInvoke,
// first record generated; or the last sink subtask's start if that is later) to the end
// of input at the sink, as Weir's turns run from their first record to their last; the
// start-up (job submission to that first record) is reported apart. All configurations run in turn,
// `warmup` rounds (2) to warm the JIT, then `rounds` rounds; the JSON holds the
// medians of those. Each run checks that every record arrived once (count and sum of
// sequence numbers) before it reports a time.

import java.io.EOFException;
import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.lang.management.ManagementFactory;
import java.net.InetSocketAddress;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReferenceArray;
import java.util.concurrent.locks.LockSupport;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.RuntimeExecutionMode;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.PrimitiveArrayTypeInfo;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.StatefulSinkWriter;
import org.apache.flink.api.connector.sink2.SupportsWriterState;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.api.connector.source.SourceReaderContext;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.api.java.typeutils.PojoTypeInfo;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.ExecutionOptions;
import org.apache.flink.configuration.MemorySize;
import org.apache.flink.configuration.RestartStrategyOptions;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.configuration.TaskManagerOptions;
import org.apache.flink.configuration.WebOptions;
import org.apache.flink.connector.datagen.source.DataGeneratorSource;
import org.apache.flink.connector.datagen.source.GeneratorFunction;
import org.apache.flink.core.execution.CheckpointingMode;
import org.apache.flink.core.io.SimpleVersionedSerializer;
import org.apache.flink.runtime.checkpoint.AbstractCheckpointStats;
import org.apache.flink.runtime.checkpoint.CheckpointStatsSnapshot;
import org.apache.flink.runtime.checkpoint.CompletedCheckpointStats;
import org.apache.flink.runtime.checkpoint.FailedCheckpointStats;
import org.apache.flink.runtime.checkpoint.SubtaskStateStats;
import org.apache.flink.runtime.checkpoint.TaskStateStats;
import org.apache.flink.runtime.executiongraph.AccessExecutionGraph;
import org.apache.flink.runtime.executiongraph.AccessExecutionVertex;
import org.apache.flink.runtime.jobgraph.JobGraph;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;
import org.apache.flink.runtime.taskmanager.TaskManagerLocation;
import org.apache.flink.runtime.util.EnvironmentInformation;
import org.apache.flink.streaming.api.datastream.AsyncDataStream;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.async.AsyncFunction;
import org.apache.flink.streaming.api.functions.async.ResultFuture;
import org.apache.flink.streaming.api.functions.async.RichAsyncFunction;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.util.Collector;

public final class WeirFlinkPeer {
    private static final int SLOTS = 2;
    private static final MemorySize NETWORK_MEMORY = MemorySize.parse("128mb");
    private static final VarHandle LONG_LE =
            MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);

    // ---------------------------------------------------------------- the sinks

    /**
     * What one sink subtask saw. The MiniCluster runs in this JVM and the job's classes
     * come from the application class path, so the sinks hand their figures to the
     * harness through this queue (published when the writer closes).
     */
    static final ConcurrentLinkedQueue<Probe> PROBES = new ConcurrentLinkedQueue<>();

    /** When the first record entered the job (first asyncInvoke, first record generated). */
    static final AtomicLong FIRST_INPUT = new AtomicLong(Long.MAX_VALUE);

    /** When the last sink subtask was ready. */
    static final AtomicLong SINKS_READY = new AtomicLong(Long.MIN_VALUE);

    /** Notes the first record of one source or operator subtask. */
    static void firstInput() {
        long now = System.nanoTime();
        FIRST_INPUT.accumulateAndGet(now, Math::min);
    }

    static final class Probe {
        long count;
        long sum;
        long first;
        long last;
        long[] latency = new long[1024];
        int latencies;

        void latency(long ns) {
            if (latencies == latency.length) {
                latency = Arrays.copyOf(latency, latencies * 2);
            }
            latency[latencies++] = Math.max(ns, 1);
        }
    }

    /** The writer side common to the sinks: first record, end of input, publication. */
    abstract static class ProbeWriter<T> implements SinkWriter<T> {
        final Probe probe = new Probe();

        ProbeWriter() {
            long now = System.nanoTime();
            SINKS_READY.accumulateAndGet(now, Math::max);
        }

        @Override
        public void flush(boolean endOfInput) {
            if (endOfInput && probe.last == 0) {
                probe.last = System.nanoTime();
            }
        }

        @Override
        public void close() {
            if (probe.last == 0) {
                probe.last = System.nanoTime();
            }
            PROBES.add(probe);
        }
    }

    /** Counts Long records and sums their values. */
    static final class LongSink implements Sink<Long> {
        @Override
        public SinkWriter<Long> createWriter(WriterInitContext context) {
            return new ProbeWriter<Long>() {
                @Override
                public void write(Long value, Context context) {
                    Probe p = probe;
                    if (p.count++ == 0) {
                        p.first = System.nanoTime();
                    }
                    p.sum += value;
                }
            };
        }
    }

    /** Records `{value, invoked at}` pairs: count, sum, and invoke-to-sink latency. */
    static final class StampedSink implements Sink<long[]> {
        @Override
        public SinkWriter<long[]> createWriter(WriterInitContext context) {
            return new ProbeWriter<long[]>() {
                @Override
                public void write(long[] value, Context context) {
                    Probe p = probe;
                    long now = System.nanoTime();
                    if (p.count++ == 0) {
                        p.first = now;
                    }
                    p.sum += value[0];
                    p.latency(now - value[1]);
                }
            };
        }
    }

    /**
     * Byte records: the sequence number in bytes 0..8 and, where non-zero, a time stamp
     * in bytes 8..16 (creation time of every 16th record, or the intended send time of
     * every record in the open loop).
     */
    static final class BytesSink implements Sink<byte[]> {
        @Override
        public SinkWriter<byte[]> createWriter(WriterInitContext context) {
            return new ProbeWriter<byte[]>() {
                @Override
                public void write(byte[] record, Context context) {
                    Probe p = probe;
                    if (p.count++ == 0) {
                        p.first = System.nanoTime();
                    }
                    p.sum += (long) LONG_LE.get(record, 0);
                    if (record.length >= 16) {
                        long stamp = (long) LONG_LE.get(record, 8);
                        if (stamp != 0) {
                            p.latency(System.nanoTime() - stamp);
                        }
                    }
                }
            };
        }
    }

    /**
     * The checkpoints suite's sink: counts records and sums their sequence numbers, and
     * keeps both as its writer state (`{count, sum}`, 16 bytes per subtask), snapshotted
     * at every checkpoint and summed on restore. `spinNs` > 0: busy-waits that long per
     * record (a System.nanoTime spin, no sleep), a sink slower than its sources.
     */
    static final class CountingSink implements Sink<byte[]>, SupportsWriterState<byte[], long[]> {
        private final long spinNs;

        CountingSink(long spinNs) {
            this.spinNs = spinNs;
        }

        @Override
        public Writer createWriter(WriterInitContext context) {
            return new Writer(spinNs, 0, 0);
        }

        @Override
        public Writer restoreWriter(WriterInitContext context, Collection<long[]> states) {
            long count = 0;
            long sum = 0;
            for (long[] state : states) {
                count += state[0];
                sum += state[1];
            }
            return new Writer(spinNs, count, sum);
        }

        @Override
        public SimpleVersionedSerializer<long[]> getWriterStateSerializer() {
            return new SimpleVersionedSerializer<>() {
                @Override
                public int getVersion() {
                    return 1;
                }

                @Override
                public byte[] serialize(long[] state) {
                    byte[] bytes = new byte[16];
                    LONG_LE.set(bytes, 0, state[0]);
                    LONG_LE.set(bytes, 8, state[1]);
                    return bytes;
                }

                @Override
                public long[] deserialize(int version, byte[] bytes) {
                    return new long[] {(long) LONG_LE.get(bytes, 0), (long) LONG_LE.get(bytes, 8)};
                }
            };
        }

        static final class Writer extends ProbeWriter<byte[]> implements StatefulSinkWriter<byte[], long[]> {
            private final long spinNs;

            Writer(long spinNs, long count, long sum) {
                this.spinNs = spinNs;
                probe.count = count;
                probe.sum = sum;
            }

            @Override
            public void write(byte[] record, Context context) {
                Probe p = probe;
                long now = System.nanoTime();
                if (p.count++ == 0) {
                    p.first = now;
                }
                p.sum += (long) LONG_LE.get(record, 0);
                if (spinNs > 0) {
                    long until = now + spinNs;
                    while (System.nanoTime() < until) {
                        Thread.onSpinWait();
                    }
                }
            }

            @Override
            public List<long[]> snapshotState(long checkpointId) {
                return List.of(new long[] {probe.count, probe.sum});
            }
        }
    }

    // ---------------------------------------------------------------- async functions

    /** Completes inside asyncInvoke (latency 0: the operator's own cost). */
    static final class Immediate extends RichAsyncFunction<Long, Long> {
        private transient boolean started;

        @Override
        public void asyncInvoke(Long input, ResultFuture<Long> result) {
            if (!started) {
                started = true;
                firstInput();
            }
            result.complete(Collections.singleton(input));
        }
    }

    /**
     * Completes each call on one dedicated completer thread, as Weir's side of the
     * experiment: asyncInvoke (only ever called on the task's mailbox thread, so a single
     * producer) puts the call on a bounded single-producer/single-consumer array queue;
     * the completer thread busy-polls it and completes each call with its input. While
     * the queue is empty it spins (Thread.onSpinWait() 64 times, then Thread.yield(), as
     * Weir's backoff), and parks for 50 µs only after some 10,000 empty polls in a row, so
     * that an idle thread does not hold a core; handing a call over takes no lock and no
     * wake-up (completing it is Flink's own: a mail to the task's mailbox).
     */
    static final class OtherThread extends RichAsyncFunction<Long, Long> {
        private transient SpscQueue<Call> calls;
        private transient Thread completer;
        private transient volatile boolean running;
        private transient boolean started;

        record Call(long input, ResultFuture<Long> result) {}

        @Override
        public void open(OpenContext context) {
            // The operator has at most its capacity (100) calls in flight, so the queue
            // never fills; 256 slots leave room to spare.
            calls = new SpscQueue<>(256);
            running = true;
            completer = new Thread(this::complete, "weir-peer-completer");
            completer.setDaemon(true);
            completer.start();
        }

        private void complete() {
            int idle = 0;
            while (running) {
                Call call = calls.poll();
                if (call != null) {
                    call.result().complete(Collections.singleton(call.input()));
                    idle = 0;
                } else if (idle < 64) {
                    Thread.onSpinWait();
                    idle++;
                } else if (idle < 10_000) {
                    Thread.yield();
                    idle++;
                } else {
                    LockSupport.parkNanos(50_000);
                }
            }
        }

        @Override
        public void asyncInvoke(Long input, ResultFuture<Long> result) {
            if (!started) {
                started = true;
                firstInput();
            }
            Call call = new Call(input, result);
            while (!calls.offer(call)) {
                Thread.onSpinWait();
            }
        }

        @Override
        public void close() throws InterruptedException {
            running = false;
            if (completer != null) {
                LockSupport.unpark(completer);
                completer.join();
            }
        }
    }

    /**
     * A bounded single-producer/single-consumer queue over an array, as Weir's ring and
     * rtrb are built: the producer publishes a slot by a release store of `tail`, the
     * consumer frees it by a release store of `head`; each index lives on its own cache
     * line (an AtomicLongArray, 128 bytes apart), and each side keeps a cached copy of the
     * other's index, reading it again only when the queue looks full or empty.
     */
    static final class SpscQueue<T> {
        private static final int HEAD = 0;
        private static final int TAIL = 16;
        private final Object[] slots;
        private final int mask;
        private final java.util.concurrent.atomic.AtomicLongArray indices =
                new java.util.concurrent.atomic.AtomicLongArray(32);
        /** The producer's copy of `head`. */
        private long headCache;
        /** The consumer's copy of `tail`. */
        private long tailCache;

        SpscQueue(int capacity) {
            if (Integer.bitCount(capacity) != 1) {
                throw new IllegalArgumentException("capacity must be a power of two");
            }
            slots = new Object[capacity];
            mask = capacity - 1;
        }

        /** The producer's side: false if the queue is full. */
        boolean offer(T item) {
            long t = indices.getPlain(TAIL);
            if (t - headCache == slots.length) {
                headCache = indices.getAcquire(HEAD);
                if (t - headCache == slots.length) {
                    return false;
                }
            }
            slots[(int) t & mask] = item;
            indices.setRelease(TAIL, t + 1);
            return true;
        }

        /** The consumer's side: null if the queue is empty. */
        @SuppressWarnings("unchecked")
        T poll() {
            long h = indices.getPlain(HEAD);
            if (h == tailCache) {
                tailCache = indices.getAcquire(TAIL);
                if (h == tailCache) {
                    return null;
                }
            }
            int i = (int) h & mask;
            T item = (T) slots[i];
            slots[i] = null;
            indices.setRelease(HEAD, h + 1);
            return item;
        }
    }

    /** Completes from a scheduled executor `latency` after asyncInvoke. */
    static final class Delayed extends RichAsyncFunction<Long, long[]> {
        private final long latencyNs;
        private transient ScheduledExecutorService timer;
        private transient boolean started;

        Delayed(long latencyNs) {
            this.latencyNs = latencyNs;
        }

        @Override
        public void open(OpenContext context) {
            timer = Executors.newSingleThreadScheduledExecutor();
        }

        @Override
        public void asyncInvoke(Long input, ResultFuture<long[]> result) {
            long invoked = System.nanoTime();
            if (!started) {
                started = true;
                firstInput();
            }
            long value = input;
            timer.schedule(
                    () -> result.complete(Collections.singleton(new long[] {value, invoked})),
                    latencyNs,
                    TimeUnit.NANOSECONDS);
        }

        @Override
        public void close() {
            timer.shutdownNow();
        }
    }

    // ---------------------------------------------------------------- exchange records

    /**
     * N-byte records. Under object reuse the source serialises each record into the
     * network buffer before it asks for the next, so one array per reader is reused, as
     * Weir's and the crossbeam peer's fixed-size records are.
     */
    static final class Records implements GeneratorFunction<Long, byte[]> {
        private final int size;
        private final long intervalNs;
        private final boolean stamps;
        private transient byte[] record;
        private transient long epoch;
        private transient long origin;

        /** `intervalNs` > 0: open loop, every record stamped with its intended send time. */
        Records(int size, long intervalNs) {
            this(size, intervalNs, true);
        }

        /** `stamps` false: the sequence number only, no time stamps (bytes 8.. stay 7s). */
        Records(int size, long intervalNs, boolean stamps) {
            this.size = size;
            this.intervalNs = intervalNs;
            this.stamps = stamps;
        }

        @Override
        public void open(SourceReaderContext context) {
            record = new byte[size];
            Arrays.fill(record, (byte) 7);
            origin = Long.MIN_VALUE;
        }

        @Override
        public byte[] map(Long index) {
            if (epoch == 0) {
                epoch = System.nanoTime();
                firstInput();
            }
            long seq = index;
            byte[] r = record;
            LONG_LE.set(r, 0, seq);
            if (stamps && size >= 16) {
                long stamp;
                if (intervalNs > 0) {
                    // Paced here, as Weir's open loop paces its producer: Flink's
                    // RateLimiterStrategy.perSecond (Guava's smooth-bursty limiter) lets
                    // the permits stored while the job starts out as a burst, so records
                    // would leave ahead of their schedule and the latency would read 0.
                    if (origin == Long.MIN_VALUE) {
                        origin = epoch - seq * intervalNs;
                    }
                    stamp = origin + seq * intervalNs;
                    while (System.nanoTime() < stamp) {
                        Thread.onSpinWait();
                    }
                } else {
                    stamp = seq % 16 == 0 ? System.nanoTime() : 0;
                }
                LONG_LE.set(r, 8, stamp);
            }
            return r;
        }
    }

    /** The key of a record: its sequence number. */
    static final class SeqKey implements KeySelector<byte[], Long> {
        @Override
        public Long getKey(byte[] record) {
            return (long) LONG_LE.get(record, 0);
        }
    }

    // ---------------------------------------------------------------- the cases

    interface Build {
        void build(StreamExecutionEnvironment env, long n);
    }

    /**
     * A job's checkpointing: every `intervalMs`, aligned or unaligned; `alignedTimeoutMs`
     * > 0: aligned, switching to unaligned once a checkpoint's alignment took that long
     * (execution.checkpointing.aligned-checkpoint-timeout).
     */
    record Checkpoints(long intervalMs, boolean unaligned, long alignedTimeoutMs) {
        Checkpoints(long intervalMs, boolean unaligned) {
            this(intervalMs, unaligned, 0);
        }
    }

    /** The aligned checkpoint timeout of the back-pressure case that has one (Weir's too). */
    static final long ALIGNED_TIMEOUT_MS = 50;

    /**
     * `slots` > 0: a remote case, run on 2 task managers of `slots` slots each.
     * `checkpoints` null: no checkpointing. `debloat`: run on a MiniCluster with buffer
     * debloating on (a task manager setting, so a cluster of its own).
     */
    record Case(
            String experiment,
            String implementation,
            long ops,
            Double limit,
            String job,
            Build build,
            int slots,
            Checkpoints checkpoints,
            boolean debloat) {
        Case(String experiment, String implementation, long ops, Double limit, String job, Build build) {
            this(experiment, implementation, ops, limit, job, build, 0);
        }

        Case(String experiment, String implementation, long ops, Double limit, String job, Build build, int slots) {
            this(experiment, implementation, ops, limit, job, build, slots, null, false);
        }

        Shape shape() {
            return new Shape(slots, debloat);
        }
    }

    /** The MiniCluster a case runs on. */
    record Shape(int slots, boolean debloat) {}

    static long ops(double ops) {
        return Math.max((long) ops, 1);
    }

    static <T> void asyncJob(
            StreamExecutionEnvironment env,
            long n,
            boolean ordered,
            int capacity,
            AsyncFunction<Long, T> function,
            Sink<T> sink) {
        env.setParallelism(1);
        DataStream<Long> source = env.fromSequence(0, n - 1);
        DataStream<T> results =
                ordered
                        ? AsyncDataStream.orderedWait(
                                source, function, 0, TimeUnit.MILLISECONDS, capacity)
                        : AsyncDataStream.unorderedWait(
                                source, function, 0, TimeUnit.MILLISECONDS, capacity);
        results.sinkTo(sink).name("sink");
    }

    /** The configurations of `weir compare async` (Flink has no keyed-ordered mode). */
    static List<Case> asyncCases(double scale) {
        List<Case> cases = new ArrayList<>();
        long immediate = ops(2_000_000.0 * scale);
        for (boolean ordered : new boolean[] {true, false}) {
            String mode = ordered ? "ordered" : "unordered";
            cases.add(
                    new Case(
                            "async latency 0, capacity 100, " + mode,
                            "flink " + mode,
                            immediate,
                            null,
                            "fromSequence → " + mode + "Wait(capacity 100, completes in asyncInvoke) → sink, parallelism 1, chained",
                            (env, n) -> asyncJob(env, n, ordered, 100, new Immediate(), new LongSink())));
        }
        long cross = ops(300_000.0 * scale);
        for (boolean ordered : new boolean[] {true, false}) {
            String mode = ordered ? "ordered" : "unordered";
            cases.add(
                    new Case(
                            "async completed on another thread, capacity 100",
                            "flink " + mode,
                            cross,
                            null,
                            "fromSequence → " + mode + "Wait(capacity 100, completed by one dedicated completer thread spinning on an SPSC queue) → sink, parallelism 1, chained",
                            (env, n) -> asyncJob(env, n, ordered, 100, new OtherThread(), new LongSink())));
        }
        long[][] timers = {{1, 10}, {1, 100}, {1, 1000}, {10, 1000}};
        for (long[] t : timers) {
            long latencyMs = t[0];
            int capacity = (int) t[1];
            double limit = capacity / (latencyMs / 1e3);
            cases.add(
                    new Case(
                            "async unordered, latency " + latencyMs + " ms, capacity " + capacity,
                            "flink unordered",
                            ops(Math.max(limit * 0.25 * scale, capacity * 4.0)),
                            limit,
                            "fromSequence → unorderedWait(capacity " + capacity + ", completed by a ScheduledExecutorService after " + latencyMs + " ms) → sink, parallelism 1, chained",
                            (env, n) -> asyncJob(env, n, false, capacity, new Delayed(latencyMs * 1_000_000), new StampedSink())));
        }
        cases.add(
                new Case(
                        "async ordered, latency 1 ms, capacity 1000",
                        "flink ordered",
                        ops(250_000.0 * scale),
                        1_000_000.0,
                        "fromSequence → orderedWait(capacity 1000, completed by a ScheduledExecutorService after 1 ms) → sink, parallelism 1, chained",
                        (env, n) -> asyncJob(env, n, true, 1000, new Delayed(1_000_000), new StampedSink())));
        return cases;
    }

    static void exchangeJob(
            StreamExecutionEnvironment env,
            long n,
            int size,
            int producers,
            int consumers,
            boolean keyed,
            long timeoutMs,
            long rate,
            boolean remote) {
        env.setBufferTimeout(timeoutMs);
        long intervalNs = rate > 0 ? 1_000_000_000L / rate : 0;
        DataGeneratorSource<byte[]> generator =
                new DataGeneratorSource<>(
                        new Records(size, intervalNs),
                        n,
                        PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO);
        var source =
                env.fromSource(generator, WatermarkStrategy.noWatermarks(), "records")
                        .setParallelism(producers);
        if (remote) {
            source.slotSharingGroup("producers");
        }
        DataStream<byte[]> records = source;
        DataStream<byte[]> routed =
                keyed ? records.keyBy(new SeqKey(), Types.LONG) : records.rebalance();
        var sink = routed.sinkTo(new BytesSink()).setParallelism(consumers).name("sink");
        if (remote) {
            sink.slotSharingGroup("consumers");
        }
    }

    static Case exchange(
            String experiment,
            double ops,
            int size,
            int producers,
            int consumers,
            boolean keyed,
            long timeoutMs) {
        return new Case(
                experiment,
                "flink exchange",
                ops(ops),
                null,
                "DataGeneratorSource(" + size + "-byte records, parallelism " + producers + ") → "
                        + (keyed ? "keyBy" : "rebalance") + " → sink(parallelism " + consumers
                        + "), buffer timeout " + timeoutMs + " ms",
                (env, n) -> exchangeJob(env, n, size, producers, consumers, keyed, timeoutMs, 0, false));
    }

    /** The configurations of `weir compare exchange` that a Flink job can express. */
    static List<Case> exchangeCases(double scale) {
        List<Case> cases = new ArrayList<>();
        cases.add(exchange("exchange 1→1, 8-byte records, round robin, timeout 100 ms", 4_000_000.0 * scale, 8, 1, 1, false, 100));
        cases.add(exchange("exchange 1→1, 100-byte records, round robin, timeout 100 ms", 2_000_000.0 * scale, 100, 1, 1, false, 100));
        cases.add(exchange("exchange 1→1, 1000-byte records, round robin, timeout 100 ms", 500_000.0 * scale, 1000, 1, 1, false, 100));
        double ops = 1_000_000.0 * scale;
        cases.add(exchange("exchange 1→2, 100-byte records, key hash, timeout 100 ms", ops, 100, 1, 2, true, 100));
        cases.add(exchange("exchange 2→2, 100-byte records, round robin, timeout 100 ms", ops, 100, 2, 2, false, 100));
        cases.add(exchange("exchange 1→1, 100-byte records, round robin, timeout 0", ops / 4.0, 100, 1, 1, false, 0));
        long rate = 10_000;
        cases.add(
                new Case(
                        "exchange latency, open loop 10 k records/s, 100-byte records, timeout 0",
                        "flink exchange",
                        ops(Math.max(rate * 0.5 * scale, 1000.0)),
                        (double) rate,
                        "DataGeneratorSource(100-byte records, each generated at its intended send time, 10 k/s) → rebalance → sink, buffer timeout 0 ms; latency from the intended send time",
                        (env, n) -> exchangeJob(env, n, 100, 1, 1, false, 0, rate, false)));
        return cases;
    }

    /** The remote exchange: `pairs` producers on one task manager, as many consumers on the other. */
    static Case remote(String experiment, double ops, int size, int pairs, long timeoutMs, long rate) {
        String job =
                "DataGeneratorSource(" + size + "-byte records, parallelism " + pairs
                        + (rate > 0 ? ", each generated at its intended send time, " + rate / 1000 + " k/s" : "")
                        + ", slot sharing group producers) → rebalance → sink(parallelism " + pairs
                        + ", slot sharing group consumers), buffer timeout " + timeoutMs
                        + " ms; 2 task managers of " + pairs + " slot" + (pairs > 1 ? "s" : "")
                        + " each, producers on one, consumers on the other (Netty over loopback TCP)"
                        + (rate > 0 ? "; latency from the intended send time" : "");
        return new Case(
                experiment,
                "flink remote exchange, 2 task managers",
                ops(ops),
                rate > 0 ? (double) rate : null,
                job,
                (env, n) -> exchangeJob(env, n, size, pairs, pairs, false, timeoutMs, rate, true),
                pairs);
    }

    /** The configurations of `weir compare remote` that a Flink job can express. */
    static List<Case> remoteCases(double scale) {
        List<Case> cases = new ArrayList<>();
        for (int pairs : new int[] {1, 2}) {
            String shape = "remote " + pairs + "→" + pairs + ", ";
            cases.add(remote(shape + "8-byte records, timeout 100 ms", 2_000_000.0 * scale, 8, pairs, 100, 0));
            cases.add(remote(shape + "100-byte records, timeout 100 ms", 1_000_000.0 * scale, 100, pairs, 100, 0));
            cases.add(remote(shape + "1000-byte records, timeout 100 ms", 200_000.0 * scale, 1000, pairs, 100, 0));
        }
        long rate = 10_000;
        cases.add(
                remote(
                        "remote latency, open loop 10 k records/s, 100-byte records, timeout 0",
                        Math.max(rate * 0.5 * scale, 1000.0),
                        100,
                        1,
                        0,
                        rate));
        return cases;
    }

    /** Records per run of the checkpoint overhead cases at full size (some 3 s). */
    static final double OVERHEAD_RECORDS = 12_000_000.0;

    /** The back-pressured sink's busy wait per record. */
    static final long SPIN_NS = 20_000;

    /** Records per back-pressured run at full size: 2 sinks × 50,000 records/s × 6 s. */
    static final double BACK_PRESSURE_RECORDS = 2 * 50_000 * 6.0;

    static void checkpointJob(StreamExecutionEnvironment env, long n, long spinNs) {
        checkpointJob(env, n, spinNs, false);
    }

    /**
     * The checkpoints job; `remote`: the sources and the sinks in slot sharing groups of
     * their own, so that on two task managers (a case with slots) every record crosses
     * the network (runs placed otherwise are retried, see run).
     */
    static void checkpointJob(StreamExecutionEnvironment env, long n, long spinNs, boolean remote) {
        env.setBufferTimeout(100);
        DataGeneratorSource<byte[]> generator =
                new DataGeneratorSource<>(
                        new Records(64, 0, false),
                        n,
                        PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO);
        var source = env.fromSource(generator, WatermarkStrategy.noWatermarks(), "records").setParallelism(2);
        if (remote) {
            source.slotSharingGroup("producers");
        }
        var sink = source.keyBy(new SeqKey(), Types.LONG)
                .sinkTo(new CountingSink(spinNs))
                .setParallelism(2)
                .name("sink");
        if (remote) {
            sink.slotSharingGroup("consumers");
        }
    }

    static String every(long intervalMs) {
        return intervalMs % 1000 == 0 ? intervalMs / 1000 + " s" : intervalMs + " ms";
    }

    /**
     * The checkpoints suite: the keyed 2→2 job without checkpoints and with aligned or
     * unaligned checkpoints (overhead), and with a sink that busy-waits per record
     * (back-pressure): aligned, unaligned, aligned with buffer debloating. Every 1 s at
     * full size, every 100 ms below it (--quick), so that short runs still checkpoint.
     */
    static List<Case> checkpointCases(double scale) {
        long intervalMs = scale < 1 ? 100 : 1000;
        String job =
                "DataGeneratorSource(64-byte records carrying their sequence number, parallelism 2) → "
                        + "keyBy(sequence number) → sink(parallelism 2: counts records and sums sequence "
                        + "numbers, {count, sum} as its writer state%s), buffer timeout 100 ms%s";
        String with =
                "; checkpoints every " + every(intervalMs)
                        + " (%s, EXACTLY_ONCE, HashMapStateBackend, file:// storage in a fresh temp directory, max 1 concurrent)";
        List<Case> cases = new ArrayList<>();
        long n = ops(OVERHEAD_RECORDS * scale);
        cases.add(
                new Case(
                        "checkpoint overhead",
                        "flink, no checkpoints",
                        n,
                        null,
                        String.format(job, "", "; no checkpointing"),
                        (env, records) -> checkpointJob(env, records, 0),
                        0,
                        null,
                        false));
        for (boolean unaligned : new boolean[] {false, true}) {
            String mode = unaligned ? "unaligned" : "aligned";
            cases.add(
                    new Case(
                            "checkpoint overhead",
                            "flink, " + mode + " checkpoints every " + every(intervalMs),
                            n,
                            null,
                            String.format(job, "", String.format(with, mode)),
                            (env, records) -> checkpointJob(env, records, 0),
                            0,
                            new Checkpoints(intervalMs, unaligned),
                            false));
        }
        long m = ops(BACK_PRESSURE_RECORDS * scale);
        String spin = ", busy-waiting " + SPIN_NS / 1000 + " µs per record (System.nanoTime spin)";
        String[][] backPressured = {
            {"flink, aligned", "aligned", ""},
            {"flink, unaligned", "unaligned", ""},
            {"flink, aligned with buffer debloating", "aligned",
                "; buffer debloating on (taskmanager.network.memory.buffer-debloat.enabled: true, "
                        + "default target 1 s and period 200 ms) on a MiniCluster of its own"},
            {"flink, aligned with a 50 ms timeout", "aligned",
                "; aligned-checkpoint-timeout 50 ms (unaligned once a checkpoint's alignment took that long)"},
        };
        // In one task manager, then over two task managers (2 slots each), the sources on
        // one and the sinks on the other: every record crosses Netty, as Weir's
        // two-process runs cross its transport.
        for (boolean remote : new boolean[] {false, true}) {
            for (String[] b : backPressured) {
                boolean unaligned = b[1].equals("unaligned");
                boolean timeout = b[0].contains("timeout");
                boolean debloat = !b[2].isEmpty() && !timeout;
                String described = String.format(job, spin, String.format(with, b[1]) + b[2]);
                cases.add(
                        new Case(
                                remote
                                        ? "checkpoints under back-pressure, two processes"
                                        : "checkpoints under back-pressure",
                                b[0],
                                m,
                                null,
                                remote
                                        ? described
                                                + "; on 2 task managers of 2 slots, sources and sinks in slot sharing groups of their own and on different task managers"
                                        : described,
                                (env, records) -> checkpointJob(env, records, SPIN_NS, remote),
                                remote ? 2 : 0,
                                new Checkpoints(intervalMs, unaligned, timeout ? ALIGNED_TIMEOUT_MS : 0),
                                debloat));
            }
        }
        return cases;
    }

    // ---------------------------------------------------------------- the main job

    /**
     * A record as the main job's generator makes it: a unique id (0..records), the lookup
     * key, and its creation time (System.nanoTime() when the generator made it). A POJO
     * (public no-argument constructor, public fields), so that Flink serialises it with
     * its PojoSerializer rather than Kryo; mainJobGraph checks that it does.
     */
    public static final class LookupRecord {
        public long id;
        public long key;
        public long createdNs;

        public LookupRecord() {}

        public LookupRecord(long id, long key, long createdNs) {
            this.id = id;
            this.key = key;
            this.createdNs = createdNs;
        }
    }

    /** The record enriched with the value the lookup service returned for its key. */
    public static final class Enriched {
        public long id;
        public long key;
        public long createdNs;
        public byte[] value;

        public Enriched() {}

        public Enriched(LookupRecord record, byte[] value) {
            this.id = record.id;
            this.key = record.key;
            this.createdNs = record.createdNs;
            this.value = value;
        }
    }

    /** The splitmix64 finalizer: the key of record `id` is splitmix64(id) mod keys. */
    static long splitmix64(long x) {
        long z = x + 0x9E3779B97F4A7C15L;
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }

    static final com.sun.management.OperatingSystemMXBean OS =
            (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();

    /** CPU time of every thread of this process (user + system), as Weir's `weir run` counts it. */
    static long processCpuNs() {
        return OS.getProcessCpuTime();
    }

    /** Process CPU time when the first record was generated, and when the last sink reached end of input. */
    static final AtomicLong CPU_AT_FIRST = new AtomicLong(Long.MAX_VALUE);

    static final AtomicLong CPU_AT_LAST = new AtomicLong(Long.MIN_VALUE);

    /**
     * The main job's generator: record `index` (DataGeneratorSource hands each reader
     * its share of 0..records) with key splitmix64(index) mod keys, uniform over the keys,
     * stamped with System.nanoTime() as it is made. Unthrottled (no RateLimiterStrategy):
     * the reader makes the next record as soon as the chained async operator takes one,
     * i.e. as fast as the pipeline accepts.
     */
    static final class LookupRecords implements GeneratorFunction<Long, LookupRecord> {
        private final long keys;
        private transient boolean started;

        LookupRecords(long keys) {
            this.keys = keys;
        }

        @Override
        public LookupRecord map(Long index) {
            long now = System.nanoTime();
            if (!started) {
                started = true;
                firstInput();
                CPU_AT_FIRST.accumulateAndGet(processCpuNs(), Math::min);
            }
            long id = index;
            return new LookupRecord(id, Long.remainderUnsigned(splitmix64(id), keys), now);
        }
    }

    /**
     * The lookup, as a Flink user who cares about throughput writes an async client for a
     * pipelined binary protocol (Weir's lookup service: request `len u32 = 16 | request
     * id u64 | key u64`, response `len u32 | request id u64 | status u8 | value`, little
     * endian, answered in any order and matched by request id):
     *
     * - One TCP connection per subtask (opened in open(), TCP_NODELAY), pipelined: every
     *   lookup the operator has in flight (up to its capacity) is outstanding on it at
     *   once; nothing waits for an answer before the next request goes out.
     * - Writes are batched, not one syscall per request: asyncInvoke (always on the task
     *   thread) only appends its 20-byte frame to a pending buffer under a short lock and
     *   wakes the I/O thread (Selector.wakeup, one eventfd write) only when that buffer
     *   was empty, i.e. when the I/O thread has already taken everything before it. The
     *   I/O thread swaps the pending buffer for its own and writes all of it in one
     *   write(), so the many requests asyncInvoke makes while the I/O thread is busy go
     *   out together, as Netty's flush consolidation or Weir's own client batch them.
     * - One dedicated I/O thread per subtask with a java.nio Selector (non-blocking
     *   channel, level-triggered epoll on Linux) does all the socket work: it writes the
     *   pending requests (registering OP_WRITE only when the socket buffer is full) and
     *   reads responses into a 256 KiB direct ByteBuffer, parses every whole frame in
     *   it and completes each ResultFuture from this thread (Flink hands completions to
     *   the task's mailbox, so completing from any thread is the intended use).
     * - Outstanding requests live in an array of a power of two ≥ 4 × capacity slots
     *   indexed by request id mod its size, the id kept in the entry as the check; no
     *   map, no boxing. asyncInvoke takes the next id whose slot is free.
     * - A malformed response (length outside 9..9 + 1 MiB, unknown status, an id not
     *   outstanding), the service closing the connection or any I/O error fails every
     *   outstanding lookup (completeExceptionally) and every later one, which fails the
     *   job (no restart strategy). A status-1 answer fails its lookup with the service's
     *   message. close() stops the I/O thread and closes the socket.
     */
    static final class LookupFunction extends RichAsyncFunction<LookupRecord, Enriched> {
        static final int MAX_VALUE = 1 << 20;
        static final int READ_BUFFER = 256 * 1024;
        static final int REQUEST = 20;

        private final String host;
        private final int port;
        private final int capacity;

        private transient SocketChannel channel;
        private transient Selector selector;
        private transient SelectionKey selection;
        private transient Thread io;
        private transient volatile boolean running;
        private transient volatile Throwable failure;
        /** Outstanding lookups by request id mod their number (a power of two). */
        private transient AtomicReferenceArray<Outstanding> outstanding;
        private transient int mask;
        /** The task thread's next request id. */
        private transient long nextId;
        /** Guards `pending`. */
        private transient Object lock;
        /** Requests not yet taken by the I/O thread (appended by the task thread). */
        private transient ByteBuffer pending;
        /** The I/O thread's: requests being written (position..limit left to write). */
        private transient ByteBuffer writing;
        /** The I/O thread's: bytes read and not yet parsed (position = end of data). */
        private transient ByteBuffer reading;
        /** Counts for ClientStats: the task thread's (requests, wakeups) and the I/O thread's. */
        private transient long requests;
        private transient long wakeups;
        private transient long writes;
        private transient long reads;

        record Outstanding(long id, LookupRecord input, ResultFuture<Enriched> result) {}

        LookupFunction(String host, int port, int capacity) {
            this.host = host;
            this.port = port;
            this.capacity = capacity;
        }

        @Override
        public void open(OpenContext context) throws IOException {
            int slots = Integer.highestOneBit(Math.max(4 * capacity, 1024) - 1) << 1;
            outstanding = new AtomicReferenceArray<>(slots);
            mask = slots - 1;
            lock = new Object();
            pending = ByteBuffer.allocateDirect(REQUEST * (capacity + 64)).order(ByteOrder.LITTLE_ENDIAN);
            writing = ByteBuffer.allocateDirect(REQUEST * (capacity + 64)).order(ByteOrder.LITTLE_ENDIAN);
            writing.limit(0);
            reading = ByteBuffer.allocateDirect(READ_BUFFER).order(ByteOrder.LITTLE_ENDIAN);
            channel = SocketChannel.open();
            try {
                channel.setOption(StandardSocketOptions.TCP_NODELAY, true);
                channel.socket().connect(new InetSocketAddress(host, port), 5_000);
                channel.configureBlocking(false);
                selector = Selector.open();
                selection = channel.register(selector, SelectionKey.OP_READ);
            } catch (IOException e) {
                channel.close();
                throw new IOException("cannot connect to the lookup service at " + host + ":" + port + ": " + e, e);
            }
            running = true;
            io = new Thread(this::ioLoop, "weir-peer-lookup-io-" + getRuntimeContext().getTaskInfo().getIndexOfThisSubtask());
            io.setDaemon(true);
            io.start();
        }

        @Override
        public void asyncInvoke(LookupRecord input, ResultFuture<Enriched> result) {
            Throwable failed = failure;
            if (failed != null) {
                result.completeExceptionally(failed);
                return;
            }
            // The next id whose slot is free: at most `capacity` lookups are outstanding
            // (more only where timed-out ones are still unanswered), so this is the next id
            // but in rare cases.
            long id = nextId;
            int slot = (int) id & mask;
            for (int probes = 0; outstanding.get(slot) != null; probes++) {
                if (probes > mask) {
                    result.completeExceptionally(
                            new IllegalStateException("more than " + (mask + 1) + " lookups outstanding"));
                    return;
                }
                id++;
                slot = (int) id & mask;
            }
            nextId = id + 1;
            Outstanding entry = new Outstanding(id, input, result);
            outstanding.set(slot, entry);
            boolean wake;
            synchronized (lock) {
                ByteBuffer p = pending;
                if (p.remaining() < REQUEST) {
                    ByteBuffer bigger = ByteBuffer.allocateDirect(p.capacity() * 2).order(ByteOrder.LITTLE_ENDIAN);
                    p.flip();
                    bigger.put(p);
                    pending = p = bigger;
                }
                wake = p.position() == 0;
                p.putInt(16).putLong(id).putLong(input.key);
            }
            requests++;
            if (wake) {
                wakeups++;
                selector.wakeup();
            }
            // Lost the race with a failure of the connection: fail this lookup too.
            if (failure != null && outstanding.compareAndSet(slot, entry, null)) {
                result.completeExceptionally(failure);
            }
        }

        private void ioLoop() {
            try {
                while (running) {
                    selector.select();
                    if (!running) {
                        break;
                    }
                    boolean readable = selection.isValid() && !selector.selectedKeys().isEmpty() && selection.isReadable();
                    selector.selectedKeys().clear();
                    flush();
                    if (readable) {
                        read();
                    }
                }
            } catch (Throwable t) {
                if (running) {
                    fail(t);
                }
            }
        }

        /** Writes what is pending, as few writes as the socket buffer allows. */
        private void flush() throws IOException {
            boolean full = false;
            while (true) {
                if (!writing.hasRemaining()) {
                    synchronized (lock) {
                        if (pending.position() == 0) {
                            break;
                        }
                        ByteBuffer taken = pending;
                        writing.clear();
                        pending = writing;
                        writing = taken;
                    }
                    writing.flip();
                }
                channel.write(writing);
                writes++;
                if (writing.hasRemaining()) {
                    full = true;
                    break;
                }
            }
            int ops = full ? SelectionKey.OP_READ | SelectionKey.OP_WRITE : SelectionKey.OP_READ;
            if (selection.interestOps() != ops) {
                selection.interestOps(ops);
            }
        }

        /** Reads what the socket has and completes every whole response in it. */
        private void read() throws IOException {
            reads++;
            if (channel.read(reading) < 0) {
                throw new EOFException("the lookup service at " + host + ":" + port + " closed the connection");
            }
            ByteBuffer r = reading;
            r.flip();
            int needed = 0;
            while (r.remaining() >= 4) {
                int at = r.position();
                long length = Integer.toUnsignedLong(r.getInt(at));
                if (length < 9 || length > 9 + MAX_VALUE) {
                    throw new IOException("malformed response from the lookup service: length " + length);
                }
                if (r.remaining() < 4 + length) {
                    needed = (int) (4 + length);
                    break;
                }
                long id = r.getLong(at + 4);
                byte status = r.get(at + 12);
                byte[] value = new byte[(int) length - 9];
                r.get(at + 13, value);
                r.position(at + 4 + (int) length);
                complete(id, status, value);
            }
            r.compact();
            if (needed > r.capacity()) {
                ByteBuffer bigger = ByteBuffer.allocateDirect(needed).order(ByteOrder.LITTLE_ENDIAN);
                r.flip();
                bigger.put(r);
                reading = bigger;
            }
        }

        private void complete(long id, byte status, byte[] value) throws IOException {
            if (status != 0 && status != 1) {
                throw new IOException("malformed response from the lookup service: status " + status);
            }
            int slot = (int) id & mask;
            Outstanding entry = outstanding.get(slot);
            if (entry == null || entry.id() != id) {
                throw new IOException("the lookup service answered request " + id + ", which is not outstanding");
            }
            if (!outstanding.compareAndSet(slot, entry, null)) {
                return;
            }
            if (status == 0) {
                entry.result().complete(Collections.singleton(new Enriched(entry.input(), value)));
            } else {
                entry.result().completeExceptionally(
                        new IOException("the lookup service failed key " + entry.input().key + ": "
                                + new String(value, StandardCharsets.UTF_8)));
            }
        }

        /** Fails every outstanding lookup and every later one; drops the connection. */
        private void fail(Throwable cause) {
            Throwable failed = cause instanceof IOException
                    ? cause
                    : new IOException("lookup client failed: " + cause, cause);
            failure = failed;
            for (int i = 0; i <= mask; i++) {
                Outstanding entry = outstanding.getAndSet(i, null);
                if (entry != null) {
                    entry.result().completeExceptionally(failed);
                }
            }
            try {
                channel.close();
            } catch (IOException ignored) {
                // Already failing.
            }
        }

        @Override
        public void close() throws Exception {
            running = false;
            if (selector != null) {
                selector.wakeup();
            }
            if (io != null) {
                io.join(5_000);
                CLIENT_STATS.requests.addAndGet(requests);
                CLIENT_STATS.wakeups.addAndGet(wakeups);
                CLIENT_STATS.writes.addAndGet(writes);
                CLIENT_STATS.reads.addAndGet(reads);
                CLIENT_STATS.connections.incrementAndGet();
            }
            if (channel != null) {
                channel.close();
            }
            if (selector != null) {
                selector.close();
            }
        }
    }

    /**
     * What the lookup clients did in a run (summed over the subtasks when they close): the
     * evidence that writes are batched.
     */
    static final class ClientStats {
        final AtomicLong requests = new AtomicLong();
        final AtomicLong writes = new AtomicLong();
        final AtomicLong wakeups = new AtomicLong();
        final AtomicLong reads = new AtomicLong();
        final AtomicLong connections = new AtomicLong();

        void clear() {
            requests.set(0);
            writes.set(0);
            wakeups.set(0);
            reads.set(0);
            connections.set(0);
        }
    }

    static final ClientStats CLIENT_STATS = new ClientStats();

    /** The key of an enriched record: its lookup key. */
    static final class EnrichedKey implements KeySelector<Enriched, Long> {
        @Override
        public Long getKey(Enriched record) {
            return record.key;
        }
    }

    /** What one main-job sink subtask saw of the ids: a bitset of 0..records. */
    static final class IdCheck {
        final long[] seen;
        final long records;
        long arrivals;
        long outOfRange;
        long badValues;

        IdCheck(long records) {
            this.records = records;
            seen = new long[(int) ((records + 63) / 64)];
        }
    }

    /** The main job's sinks' bitsets, published when their writers close. */
    static final ConcurrentLinkedQueue<IdCheck> CHECKS = new ConcurrentLinkedQueue<>();

    /**
     * The main job's sink: counts records, marks each id in a bitset (merged over the
     * subtasks afterwards: unique, duplicated, lost), checks the value's length, and
     * records each record's latency (arrival − creation, both System.nanoTime()).
     */
    static final class CheckingSink implements Sink<Enriched> {
        private final long records;
        private final int parallelism;
        private final int valueSize;

        CheckingSink(long records, int parallelism, int valueSize) {
            this.records = records;
            this.parallelism = parallelism;
            this.valueSize = valueSize;
        }

        @Override
        public SinkWriter<Enriched> createWriter(WriterInitContext context) {
            IdCheck check = new IdCheck(records);
            ProbeWriter<Enriched> writer = new ProbeWriter<>() {
                @Override
                public void write(Enriched record, Context context) {
                    long now = System.nanoTime();
                    Probe p = probe;
                    if (p.count++ == 0) {
                        p.first = now;
                    }
                    p.last = now;
                    p.sum += record.id;
                    p.latency(now - record.createdNs);
                    IdCheck c = check;
                    c.arrivals++;
                    long id = record.id;
                    if (id < 0 || id >= c.records) {
                        c.outOfRange++;
                    } else {
                        c.seen[(int) (id >>> 6)] |= 1L << id;
                    }
                    if (record.value == null || record.value.length != valueSize) {
                        c.badValues++;
                    }
                }

                @Override
                public void flush(boolean endOfInput) {
                    if (endOfInput) {
                        CPU_AT_LAST.accumulateAndGet(processCpuNs(), Math::max);
                    }
                    super.flush(endOfInput);
                }

                @Override
                public void close() {
                    super.close();
                    CHECKS.add(check);
                }
            };
            // Room for this subtask's share and then some, so that the latencies are not
            // copied while the job runs.
            writer.probe.latency = new long[(int) Math.min(records / parallelism + records / 8 + 1024, Integer.MAX_VALUE - 8)];
            return writer;
        }
    }

    /** The mainjob suite's settings. */
    record MainJob(
            long records,
            int capacity,
            long keys,
            String host,
            int port,
            String latency,
            int valueSize,
            long bufferTimeoutMs,
            int parallelism,
            long timeoutMs) {
        String name() {
            return "main job (lookup service, " + latency + ")";
        }

        String addr() {
            return host + ":" + port;
        }

        /** Little's limit, parallelism × capacity ÷ latency, where the latency is fixed:<duration>. */
        Double limit() {
            java.util.regex.Matcher m =
                    java.util.regex.Pattern.compile("fixed:([0-9.]+)(ns|us|µs|ms|s)").matcher(latency);
            if (!m.matches()) {
                return null;
            }
            double seconds = Double.parseDouble(m.group(1)) * switch (m.group(2)) {
                case "ns" -> 1e-9;
                case "us", "µs" -> 1e-6;
                case "ms" -> 1e-3;
                default -> 1.0;
            };
            return seconds > 0 ? parallelism * capacity / seconds : null;
        }

        String describe() {
            return "DataGeneratorSource(records {id, key, created_ns}, key = splitmix64(id) mod " + keys
                    + " (uniform), unthrottled, parallelism " + parallelism + ") → AsyncDataStream.unorderedWait("
                    + "timeout " + timeoutMs + " ms, capacity " + capacity + "; RichAsyncFunction over one pipelined "
                    + "TCP connection per subtask to the lookup service at " + addr() + ", writes batched on one "
                    + "NIO I/O thread per subtask) → keyBy(key) → sink(parallelism " + parallelism + ": counts, "
                    + "bitset of ids, latency now − created_ns), buffer timeout " + bufferTimeoutMs + " ms";
        }
    }

    static void mainJobGraph(StreamExecutionEnvironment env, MainJob job, long n) {
        env.setParallelism(job.parallelism());
        env.setBufferTimeout(job.bufferTimeoutMs());
        TypeInformation<LookupRecord> recordType = TypeInformation.of(LookupRecord.class);
        TypeInformation<Enriched> enrichedType = TypeInformation.of(Enriched.class);
        if (!(recordType instanceof PojoTypeInfo) || !(enrichedType instanceof PojoTypeInfo)) {
            throw new IllegalStateException("the main job's records are not Flink POJOs: " + recordType + ", " + enrichedType);
        }
        DataGeneratorSource<LookupRecord> generator =
                new DataGeneratorSource<>(new LookupRecords(job.keys()), n, recordType);
        DataStream<LookupRecord> records =
                env.fromSource(generator, WatermarkStrategy.noWatermarks(), "records");
        DataStream<Enriched> enriched =
                AsyncDataStream.unorderedWait(
                                records,
                                new LookupFunction(job.host(), job.port(), job.capacity()),
                                job.timeoutMs(),
                                TimeUnit.MILLISECONDS,
                                job.capacity())
                        .returns(enrichedType)
                        .name("lookup");
        enriched.keyBy(new EnrichedKey(), Types.LONG)
                .sinkTo(new CheckingSink(n, job.parallelism(), job.valueSize()))
                .name("sink");
    }

    // ---------------------------------------------------------------- the harness

    record Turn(
            double nsPerOp,
            double startupNs,
            double finishNs,
            long[] latency,
            int latencies,
            Placement placement,
            CheckpointRun checkpoints) {}

    /**
     * One run's checkpoints, from the finished job's CheckpointStatsSnapshot: the counts,
     * and per completed checkpoint (from its history) the end-to-end duration (trigger to
     * last acknowledgement), the largest checkpoint start delay and alignment duration of
     * any subtask (ms, as Flink reports them), the in-flight data persisted (unaligned)
     * and the state size; the state backend and checkpoint storage the job ran with.
     */
    record CheckpointRun(
            long completed,
            long failed,
            List<Double> durationsMs,
            List<Double> startDelaysMs,
            List<Double> alignmentsMs,
            List<Double> persistedBytes,
            List<Double> sizesBytes,
            long lastSizeBytes,
            String stateBackend,
            String storage,
            String lastPath,
            List<String> failures,
            List<Double> inFlightBytes) {
        String describe() {
            return String.format(
                    Locale.ROOT,
                    "%d completed, %d failed; duration p50 %s max %s ms; start delay max %s ms; alignment max %s ms; persisted max %s B; last size %d B",
                    completed,
                    failed,
                    num(median(durationsMs)),
                    num(max(durationsMs)),
                    num(max(startDelaysMs)),
                    num(max(alignmentsMs)),
                    num(max(persistedBytes)),
                    lastSizeBytes);
        }
    }

    static double max(List<Double> xs) {
        return xs.stream().mapToDouble(x -> x).max().orElse(Double.NaN);
    }

    static CheckpointRun checkpointRun(AccessExecutionGraph graph, List<Double> inFlightBytes) {
        CheckpointStatsSnapshot snapshot = graph.getCheckpointStatsSnapshot();
        List<Double> durations = new ArrayList<>();
        List<Double> delays = new ArrayList<>();
        List<Double> alignments = new ArrayList<>();
        List<Double> persisted = new ArrayList<>();
        List<Double> sizes = new ArrayList<>();
        List<String> failures = new ArrayList<>();
        CompletedCheckpointStats last = null;
        List<AbstractCheckpointStats> history = new ArrayList<>(snapshot.getHistory().getCheckpoints());
        history.sort(java.util.Comparator.comparingLong(AbstractCheckpointStats::getCheckpointId));
        for (AbstractCheckpointStats checkpoint : history) {
            if (checkpoint instanceof FailedCheckpointStats failed) {
                failures.add(checkpoint.getCheckpointId() + ": " + failed.getFailureMessage());
            }
            if (!(checkpoint instanceof CompletedCheckpointStats completed)) {
                continue;
            }
            last = completed;
            durations.add((double) completed.getEndToEndDuration());
            persisted.add((double) completed.getPersistedData());
            sizes.add((double) completed.getStateSize());
            long delay = 0;
            long alignment = 0;
            for (TaskStateStats task : completed.getAllTaskStateStats()) {
                for (SubtaskStateStats subtask : task.getSubtaskStats()) {
                    if (subtask != null) {
                        delay = Math.max(delay, subtask.getCheckpointStartDelay());
                        alignment = Math.max(alignment, subtask.getAlignmentDuration());
                    }
                }
            }
            delays.add((double) delay);
            alignments.add((double) alignment);
        }
        return new CheckpointRun(
                snapshot.getCounts().getNumberOfCompletedCheckpoints(),
                snapshot.getCounts().getNumberOfFailedCheckpoints(),
                durations,
                delays,
                alignments,
                persisted,
                sizes,
                last == null ? 0 : last.getStateSize(),
                graph.getStateBackendName().orElse("unknown"),
                graph.getCheckpointStorageName().orElse("unknown"),
                last == null ? null : last.getExternalPath(),
                failures,
                inFlightBytes);
    }

    static void deleteTree(Path dir) throws IOException {
        if (dir == null || !Files.exists(dir)) {
            return;
        }
        try (var paths = Files.walk(dir)) {
            for (Path path : paths.sorted(Collections.reverseOrder()).toList()) {
                Files.deleteIfExists(path);
            }
        }
    }

    /**
     * Where a run's subtasks ran: each subtask's task manager (resource id and Netty data
     * port) from the archived execution graph, and whether no producer shared a task
     * manager with a consumer.
     */
    record Placement(List<String> subtasks, boolean remote, int taskManagers) {
        String describe() {
            return String.join("; ", subtasks);
        }
    }

    static Placement placement(AccessExecutionGraph graph) {
        List<String> subtasks = new ArrayList<>();
        java.util.Set<String> producers = new java.util.TreeSet<>();
        java.util.Set<String> consumers = new java.util.TreeSet<>();
        java.util.Set<String> all = new java.util.TreeSet<>();
        for (AccessExecutionVertex v : graph.getAllExecutionVertices()) {
            TaskManagerLocation at = v.getCurrentExecutionAttempt().getAssignedResourceLocation();
            String tm =
                    at == null
                            ? "unassigned"
                            : "task manager " + at.getResourceID().getResourceIdString() + " (data port " + at.dataPort() + ")";
            String name = v.getTaskNameWithSubtaskIndex();
            subtasks.add(name + " on " + tm);
            all.add(tm);
            if (name.contains("records")) {
                producers.add(tm);
            } else {
                consumers.add(tm);
            }
        }
        Collections.sort(subtasks);
        boolean apart = !producers.isEmpty() && !consumers.isEmpty() && !all.contains("unassigned");
        for (String tm : producers) {
            apart &= !consumers.contains(tm);
        }
        return new Placement(subtasks, apart, all.size());
    }

    /**
     * The placement of a running job once every subtask has a slot, or null where the job
     * ended first.
     */
    static Placement placementWhenAssigned(MiniCluster cluster, JobID id) throws Exception {
        while (true) {
            AccessExecutionGraph graph;
            try {
                graph = cluster.getExecutionGraph(id).get();
            } catch (Exception ended) {
                return null;
            }
            if (graph.getState().isGloballyTerminalState()) {
                return null;
            }
            // Before scheduling the graph may have no vertices yet.
            boolean assigned = graph.getAllExecutionVertices().iterator().hasNext();
            for (AccessExecutionVertex v : graph.getAllExecutionVertices()) {
                assigned &= v.getCurrentExecutionAttempt().getAssignedResourceLocation() != null;
            }
            if (assigned) {
                return placement(graph);
            }
            Thread.sleep(1);
        }
    }

    /**
     * Runs a case. Flink's scheduler places the 2 producer and 2 consumer slots of a 2→2
     * job on the 2 task managers in any order, so a remote run whose producers and
     * consumers share a task manager is cancelled as soon as its slots are assigned and
     * submitted again (up to 40 times); only runs placed apart are measured.
     */
    static Turn run(MiniCluster cluster, Case c, int[] retried) throws Exception {
        for (int attempt = 1; ; attempt++) {
            Turn turn = runOnce(cluster, c);
            if (c.slots == 0 || turn.placement.remote) {
                return turn;
            }
            retried[0]++;
            if (attempt == 40) {
                throw new IllegalStateException(
                        c.experiment + ": producers and consumers shared a task manager in 40 runs: " + turn.placement.describe());
            }
        }
    }

    /**
     * Runs a case once. With checkpoints: HashMapStateBackend, checkpoint storage on the
     * local filesystem in a fresh temp directory (deleted after the run), EXACTLY_ONCE,
     * at most 1 concurrent checkpoint, aligned or unaligned.
     */
    static Turn runOnce(MiniCluster cluster, Case c) throws Exception {
        Path dir = c.checkpoints == null ? null : Files.createTempDirectory("weir-flink-checkpoints-");
        try {
            return runOnce(cluster, c, dir);
        } finally {
            awaitDiscarded(dir);
            deleteTree(dir);
        }
    }

    /**
     * Waits (up to 10 s) until Flink has discarded the finished job's checkpoints (no
     * chk-N directory left): the job master discards them while it shuts down, after the
     * job's result is out, and fails if they vanish under it.
     */
    static void awaitDiscarded(Path dir) throws InterruptedException {
        if (dir == null) {
            return;
        }
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (System.nanoTime() < deadline) {
            try (var paths = Files.walk(dir)) {
                if (paths.noneMatch(p -> p.getFileName().toString().startsWith("chk-"))) {
                    return;
                }
            } catch (IOException | java.io.UncheckedIOException racing) {
                // A directory went away while we looked: look again.
            }
            Thread.sleep(5);
        }
    }

    static Turn runOnce(MiniCluster cluster, Case c, Path checkpointDir) throws Exception {
        Configuration jobConf = new Configuration();
        jobConf.set(ExecutionOptions.RUNTIME_MODE, RuntimeExecutionMode.STREAMING);
        if (c.checkpoints != null) {
            jobConf.set(StateBackendOptions.STATE_BACKEND, "hashmap");
            jobConf.set(CheckpointingOptions.CHECKPOINT_STORAGE, "filesystem");
            jobConf.set(CheckpointingOptions.CHECKPOINTS_DIRECTORY, checkpointDir.toUri().toString());
            jobConf.set(CheckpointingOptions.CHECKPOINTING_INTERVAL, Duration.ofMillis(c.checkpoints.intervalMs));
            jobConf.set(CheckpointingOptions.CHECKPOINTING_CONSISTENCY_MODE, CheckpointingMode.EXACTLY_ONCE);
            jobConf.set(CheckpointingOptions.MAX_CONCURRENT_CHECKPOINTS, 1);
            jobConf.set(CheckpointingOptions.ENABLE_UNALIGNED, c.checkpoints.unaligned);
            if (c.checkpoints.alignedTimeoutMs > 0) {
                // Aligned first; unaligned once the alignment took this long.
                jobConf.set(CheckpointingOptions.ENABLE_UNALIGNED, true);
                jobConf.set(
                        CheckpointingOptions.ALIGNED_CHECKPOINT_TIMEOUT,
                        Duration.ofMillis(c.checkpoints.alignedTimeoutMs));
            }
        }
        StreamExecutionEnvironment env = new StreamExecutionEnvironment(jobConf);
        env.getConfig().enableObjectReuse();
        c.build.build(env, c.ops);
        JobGraph graph = env.getStreamGraph().getJobGraph();
        PROBES.clear();
        FIRST_INPUT.set(Long.MAX_VALUE);
        SINKS_READY.set(Long.MIN_VALUE);
        long submitted = System.nanoTime();
        InFlightSampler sampler = c.checkpoints != null ? InFlightSampler.start(c.slots > 0) : null;
        JobID id = cluster.submitJob(graph).get().getJobID();
        if (c.slots > 0) {
            Placement early = placementWhenAssigned(cluster, id);
            if (early != null && !early.remote) {
                cluster.cancelJob(id).get();
                cluster.requestJobResult(id).get();
                return new Turn(Double.NaN, 0, 0, new long[0], 0, early, null);
            }
        }
        JobResult result = cluster.requestJobResult(id).get();
        long done = System.nanoTime();
        List<Double> inFlight = sampler != null ? sampler.stop() : List.of();
        if (!result.isSuccess()) {
            Throwable cause =
                    result.getSerializedThrowable()
                            .map(t -> t.deserializeError(WeirFlinkPeer.class.getClassLoader()))
                            .orElse(new IllegalStateException("job failed"));
            throw new IllegalStateException(c.experiment + ": job failed", cause);
        }
        long count = 0;
        long sum = 0;
        long first = Long.MAX_VALUE;
        long last = Long.MIN_VALUE;
        int latencies = 0;
        for (Probe p : PROBES) {
            count += p.count;
            sum += p.sum;
            if (p.count > 0) {
                first = Math.min(first, p.first);
                last = Math.max(last, p.last);
            }
            latencies += p.latencies;
        }
        long n = c.ops;
        if (count != n || sum != n * (n - 1) / 2) {
            throw new IllegalStateException(
                    c.experiment + ": records lost or duplicated (" + count + " of " + n + ")");
        }
        long[] latency = new long[latencies];
        int at = 0;
        for (Probe p : PROBES) {
            System.arraycopy(p.latency, 0, latency, at, p.latencies);
            at += p.latencies;
        }
        // The run starts when the first record enters the job, or when the last sink is
        // ready if that is later (records made before wait in the network buffers).
        long start = Math.max(FIRST_INPUT.get(), SINKS_READY.get());
        if (start == Long.MAX_VALUE || start > first) {
            start = first;
        }
        double nsPerOp = (double) (last - start) / count;
        // The evidence: where each subtask's execution attempt ran, from the finished job.
        Placement where = c.slots > 0 ? placement(cluster.getArchivedExecutionGraph(id).get()) : null;
        CheckpointRun checkpoints =
                c.checkpoints != null ? checkpointRun(cluster.getArchivedExecutionGraph(id).get(), inFlight) : null;
        return new Turn(nsPerOp, start - submitted, done - last, latency, latencies, where, checkpoints);
    }

    static double median(List<Double> samples) {
        List<Double> sorted = new ArrayList<>(samples);
        Collections.sort(sorted);
        int n = sorted.size();
        if (n == 0) {
            return Double.NaN;
        }
        return n % 2 == 1 ? sorted.get(n / 2) : (sorted.get(n / 2 - 1) + sorted.get(n / 2)) / 2;
    }

    /** The value at quantile q as HdrHistogram reports it (the ceil(q·n)-th smallest). */
    static long quantile(long[] sorted, double q) {
        int rank = (int) Math.ceil(q * sorted.length);
        return sorted[Math.min(Math.max(rank - 1, 0), sorted.length - 1)];
    }

    // ---------------------------------------------------------------- JSON

    /** This machine as the JSON object the reports carry: CPU model, cores, kernel. */
    static String machineJson() {
        return "{\"cpu\": " + str(firstLine(Path.of("/proc/cpuinfo"), "model name"))
                + ", \"cores\": " + Runtime.getRuntime().availableProcessors()
                + ", \"kernel\": " + str(firstLine(Path.of("/proc/sys/kernel/osrelease"), "")) + "}";
    }

    static String str(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            switch (ch) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                default -> {
                    if (ch < 0x20) {
                        out.append(String.format("\\u%04x", (int) ch));
                    } else {
                        out.append(ch);
                    }
                }
            }
        }
        return out.append('"').toString();
    }

    static String num(double x) {
        if (Double.isNaN(x) || Double.isInfinite(x)) {
            return "null";
        }
        return String.format(Locale.ROOT, "%.6f", x).replaceAll("0+$", "").replaceAll("\\.$", ".0");
    }

    static String list(List<Double> xs) {
        StringBuilder out = new StringBuilder("[");
        for (int i = 0; i < xs.size(); i++) {
            out.append(i > 0 ? ", " : "").append(num(xs.get(i)));
        }
        return out.append(']').toString();
    }

    static String quantiles(List<Double> xs) {
        return "{\"p50\": " + num(median(xs)) + ", \"p99\": " + num(rankQuantile(xs, 0.99))
                + ", \"max\": " + num(max(xs)) + "}";
    }

    /** The ceil(q·n)-th smallest of xs (NaN for none), as the Rust side ranks it. */
    static double rankQuantile(List<Double> xs, double q) {
        if (xs.isEmpty()) {
            return Double.NaN;
        }
        List<Double> sorted = new ArrayList<>(xs);
        Collections.sort(sorted);
        int rank = (int) Math.ceil(q * sorted.size());
        return sorted.get(Math.min(Math.max(rank - 1, 0), sorted.size() - 1));
    }

    /** A row's checkpoint figures over its measured runs (null: no checkpointing). */
    static String checkpointJson(Case c, List<CheckpointRun> runs) {
        if (c.checkpoints == null) {
            return "null";
        }
        long completed = 0;
        long failed = 0;
        List<Double> durations = new ArrayList<>();
        List<Double> delays = new ArrayList<>();
        List<Double> alignments = new ArrayList<>();
        List<Double> persisted = new ArrayList<>();
        List<Double> inFlightInput = new ArrayList<>();
        List<String> perRun = new ArrayList<>();
        List<Double> sizes = new ArrayList<>();
        java.util.Map<String, Integer> failures = new java.util.TreeMap<>();
        for (CheckpointRun run : runs) {
            sizes.addAll(run.sizesBytes());
            for (String failure : run.failures()) {
                // One entry per kind of failure, not per task: task ids left out.
                String reason = failure.substring(failure.indexOf(": ") + 2).replaceAll("[0-9a-f]{32}[0-9a-f_]*", "<task>");
                failures.merge(reason, 1, Integer::sum);
            }
            int unlisted = (int) run.failed() - run.failures().size();
            if (unlisted > 0) {
                failures.merge("(not in the history: failed before it was registered as pending)", unlisted, Integer::sum);
            }
            completed += run.completed();
            failed += run.failed();
            durations.addAll(run.durationsMs());
            delays.addAll(run.startDelaysMs());
            alignments.addAll(run.alignmentsMs());
            persisted.addAll(run.persistedBytes());
            inFlightInput.addAll(run.inFlightBytes());
            perRun.add(Long.toString(run.completed()));
        }
        CheckpointRun last = runs.isEmpty() ? null : runs.get(runs.size() - 1);
        return "{\"interval_ms\": " + c.checkpoints.intervalMs()
                + ", \"mode\": " + str(c.checkpoints.alignedTimeoutMs() > 0
                        ? "aligned, unaligned after " + c.checkpoints.alignedTimeoutMs() + " ms"
                        : c.checkpoints.unaligned() ? "unaligned" : "aligned")
                + ", \"buffer_debloating\": " + c.debloat()
                + ", \"state_backend\": " + str(last == null ? "unknown" : last.stateBackend())
                + ", \"checkpoint_storage\": " + str(last == null ? "unknown" : last.storage())
                + ", \"runs\": " + runs.size()
                + ", \"completed\": " + completed
                + ", \"failed\": " + failed
                + ", \"failure_reasons\": {" + failures.entrySet().stream()
                        .map(e -> str(e.getKey()) + ": " + e.getValue())
                        .collect(java.util.stream.Collectors.joining(", ")) + "}"
                + ", \"completed_per_run\": [" + String.join(", ", perRun) + "]"
                + ", \"duration_ms\": " + quantiles(durations)
                + ", \"start_delay_ms\": " + quantiles(delays)
                + ", \"alignment_ms\": " + quantiles(alignments)
                + ", \"persisted_bytes\": " + quantiles(persisted)
                + ", \"in_flight_bytes_exchange\": " + (inFlightInput.isEmpty() ? "null" : quantiles(inFlightInput))
                + ", \"size_bytes\": " + quantiles(sizes)
                + ", \"size_bytes_last\": " + (last == null ? "null" : last.lastSizeBytes())
                + "}";
    }

    static String firstLine(Path path, String prefix) {
        try {
            for (String line : Files.readAllLines(path)) {
                if (prefix.isEmpty()) {
                    return line.trim();
                }
                if (line.startsWith(prefix)) {
                    return line.substring(line.indexOf(':') + 1).trim();
                }
            }
        } catch (IOException e) {
            // Not Linux: unknown.
        }
        return "unknown";
    }

    // ---------------------------------------------------------------- the main job's harness

    /** One run of the main job. */
    record MainRun(
            long records,
            long unique,
            long duplicated,
            long lost,
            long outOfRange,
            long badValues,
            double elapsedNs,
            double startupNs,
            double finishNs,
            long cpuNs,
            long cpuSteadyNs,
            long[] latency,
            long requests,
            long writes,
            long wakeups,
            long reads,
            long connections) {
        double throughput() {
            return records / (elapsedNs / 1e9);
        }

        long quantileNs(double q) {
            return quantile(latency, q);
        }

        long maxNs() {
            return latency[latency.length - 1];
        }

        double cpuPerRecordNs() {
            return (double) cpuNs / records;
        }

        String describe() {
            return String.format(
                    Locale.ROOT,
                    "%9d records %10.0f records/s  p50 %6.3f ms  p99 %7.3f ms  max %8.3f ms  cpu %6.0f ns/record  start-up %4.0f ms  lost %d dup %d  %.1f requests/write",
                    records,
                    throughput(),
                    quantileNs(0.5) / 1e6,
                    quantileNs(0.99) / 1e6,
                    maxNs() / 1e6,
                    cpuPerRecordNs(),
                    startupNs / 1e6,
                    lost,
                    duplicated,
                    (double) requests / Math.max(writes, 1));
        }
    }

    /**
     * Runs the main job once on `cluster` with `n` records and checks it: every id
     * 0..n arrived exactly once, with a value of the service's size. The time is from the
     * first record generated (or the last sink's start, if later) to the last record at
     * a sink, start-up excluded and reported apart, as the other suites; the process CPU
     * time is over the whole job (submission to result, start-up included), and apart
     * over the same window as the time (`cpuSteadyNs`).
     */
    static MainRun runMain(MiniCluster cluster, MainJob job, long n) throws Exception {
        Configuration jobConf = new Configuration();
        jobConf.set(ExecutionOptions.RUNTIME_MODE, RuntimeExecutionMode.STREAMING);
        // A failed lookup fails the run rather than being retried by a restart.
        jobConf.set(RestartStrategyOptions.RESTART_STRATEGY, "disable");
        StreamExecutionEnvironment env = new StreamExecutionEnvironment(jobConf);
        env.getConfig().enableObjectReuse();
        mainJobGraph(env, job, n);
        JobGraph graph = env.getStreamGraph().getJobGraph();
        PROBES.clear();
        CHECKS.clear();
        FIRST_INPUT.set(Long.MAX_VALUE);
        SINKS_READY.set(Long.MIN_VALUE);
        CPU_AT_FIRST.set(Long.MAX_VALUE);
        CPU_AT_LAST.set(Long.MIN_VALUE);
        CLIENT_STATS.clear();
        long cpuBefore = processCpuNs();
        long submitted = System.nanoTime();
        JobID id = cluster.submitJob(graph).get().getJobID();
        // A generous bound (2 minutes plus 20 µs a record) so that a stuck job fails the run
        // instead of hanging it; the lookups' own 1 s timeout fails a job whose service
        // stops answering long before.
        long boundS = 120 + n / 50_000;
        JobResult result;
        try {
            result = cluster.requestJobResult(id).get(boundS, TimeUnit.SECONDS);
        } catch (java.util.concurrent.TimeoutException stuck) {
            cluster.cancelJob(id).get();
            throw new IllegalStateException(job.name() + ": the job did not finish within " + boundS + " s");
        }
        long done = System.nanoTime();
        long cpuAfter = processCpuNs();
        if (!result.isSuccess()) {
            Throwable cause =
                    result.getSerializedThrowable()
                            .map(t -> t.deserializeError(WeirFlinkPeer.class.getClassLoader()))
                            .orElse(new IllegalStateException("job failed"));
            throw new IllegalStateException(job.name() + ": job failed", cause);
        }
        long count = 0;
        long first = Long.MAX_VALUE;
        long last = Long.MIN_VALUE;
        int latencies = 0;
        for (Probe p : PROBES) {
            count += p.count;
            if (p.count > 0) {
                first = Math.min(first, p.first);
                last = Math.max(last, p.last);
            }
            latencies += p.latencies;
        }
        long[] seen = new long[(int) ((n + 63) / 64)];
        long arrivals = 0;
        long outOfRange = 0;
        long badValues = 0;
        for (IdCheck c : CHECKS) {
            for (int i = 0; i < seen.length; i++) {
                seen[i] |= c.seen[i];
            }
            arrivals += c.arrivals;
            outOfRange += c.outOfRange;
            badValues += c.badValues;
        }
        long unique = 0;
        for (long word : seen) {
            unique += Long.bitCount(word);
        }
        long duplicated = arrivals - outOfRange - unique;
        long lost = n - unique;
        if (count == 0) {
            throw new IllegalStateException(job.name() + ": no record reached the sinks");
        }
        long[] latency = new long[latencies];
        int at = 0;
        for (Probe p : PROBES) {
            System.arraycopy(p.latency, 0, latency, at, p.latencies);
            at += p.latencies;
        }
        Arrays.sort(latency);
        // As runOnce: from the first record entering the job, or the last sink's start if
        // that is later, to the last record at a sink.
        long start = Math.max(FIRST_INPUT.get(), SINKS_READY.get());
        if (start == Long.MAX_VALUE || start > first) {
            start = first;
        }
        long steady = CPU_AT_LAST.get() != Long.MIN_VALUE && CPU_AT_FIRST.get() != Long.MAX_VALUE
                ? CPU_AT_LAST.get() - CPU_AT_FIRST.get()
                : cpuAfter - cpuBefore;
        MainRun run = new MainRun(
                n, unique, duplicated, lost, outOfRange, badValues,
                last - start, start - submitted, done - last,
                cpuAfter - cpuBefore, steady, latency,
                CLIENT_STATS.requests.get(), CLIENT_STATS.writes.get(), CLIENT_STATS.wakeups.get(),
                CLIENT_STATS.reads.get(), CLIENT_STATS.connections.get());
        if (lost != 0 || duplicated != 0 || outOfRange != 0 || badValues != 0) {
            throw new IllegalStateException(String.format(
                    Locale.ROOT,
                    "%s: records lost or duplicated: %d records, %d arrived, %d unique, %d duplicated, %d lost, %d ids out of range, %d values not %d bytes",
                    job.name(), n, arrivals, unique, duplicated, lost, outOfRange, badValues, job.valueSize()));
        }
        return run;
    }

    /** Fails at once, with the address, where nothing listens there. */
    static void checkReachable(MainJob job) {
        try (SocketChannel probe = SocketChannel.open()) {
            probe.socket().connect(new InetSocketAddress(job.host(), job.port()), 5_000);
        } catch (IOException e) {
            throw new IllegalStateException(
                    "the lookup service at " + job.addr() + " is not reachable (" + e.getMessage() + "); start it with "
                            + "target/measure/weir serve-lookup --addr " + job.addr() + " --latency " + job.latency()
                            + " --value-size " + job.valueSize(),
                    e);
        }
    }

    static String latencyJson(MainRun r) {
        return "{\"p50\": " + r.quantileNs(0.5)
                + ", \"p90\": " + r.quantileNs(0.9)
                + ", \"p99\": " + r.quantileNs(0.99)
                + ", \"p99.9\": " + r.quantileNs(0.999)
                + ", \"max\": " + r.maxNs()
                + ", \"count\": " + r.latency().length + "}";
    }

    /**
     * The mainjob suite: `warmup` runs of at least 1,000,000 records for the JIT, then per
     * round one warm-up run (a fifth of the records; none if `warmup` is 0) and one
     * measured run, in this JVM on one MiniCluster (1 task manager, 2
     * slots) started once; the JSON has every measured round and the medians.
     */
    static void mainJob(MainJob job, int rounds, int warmup, double scale, String json, String command) throws Exception {
        long n = ops(job.records() * scale);
        long warm = ops(n * 0.2);
        long jvmWarm = Math.max(n, Math.min(1_000_000, 10 * n));
        checkReachable(job);
        long clusterStart = System.nanoTime();
        Configuration conf = new Configuration();
        conf.set(TaskManagerOptions.NETWORK_MEMORY_MIN, NETWORK_MEMORY);
        conf.set(TaskManagerOptions.NETWORK_MEMORY_MAX, NETWORK_MEMORY);
        conf.set(TaskManagerOptions.MANAGED_MEMORY_SIZE, MemorySize.parse("64mb"));
        MiniClusterConfiguration config =
                new MiniClusterConfiguration.Builder()
                        .setConfiguration(conf)
                        .setNumTaskManagers(1)
                        .setNumSlotsPerTaskManager(job.parallelism())
                        .withRandomPorts()
                        .build();
        List<MainRun> runs = new ArrayList<>();
        List<MainRun> warmups = new ArrayList<>();
        List<Double> roundSeconds = new ArrayList<>();
        double clusterStartMs;
        try (MiniCluster cluster = new MiniCluster(config)) {
            cluster.start();
            clusterStartMs = (System.nanoTime() - clusterStart) / 1e6;
            System.err.printf(
                    Locale.ROOT,
                    "flink %s: MiniCluster of 1 task manager with %d slots up in %.0f ms; %s%n",
                    EnvironmentInformation.getVersion(),
                    job.parallelism(),
                    clusterStartMs,
                    job.describe());
            // The JIT first: `warmup` (2) runs of at least 1,000,000 records before the first
            // round (a fifth of 300,000 records per round leaves the first rounds of --quick
            // at a third of the steady rate), as the other suites' 2 warm-up rounds.
            for (int i = 0; i < warmup; i++) {
                MainRun w = runMain(cluster, job, jvmWarm);
                System.err.println("JVM warm-up " + w.describe());
            }
            for (int round = 1; round <= rounds; round++) {
                long roundStart = System.nanoTime();
                if (warmup > 0) {
                    MainRun w = runMain(cluster, job, warm);
                    warmups.add(w);
                    System.err.println("warm-up  " + w.describe());
                }
                MainRun r = runMain(cluster, job, n);
                runs.add(r);
                double seconds = (System.nanoTime() - roundStart) / 1e9;
                roundSeconds.add(seconds);
                System.err.printf(Locale.ROOT, "round %-2d %s  (round %.1f s)%n", round, r.describe(), seconds);
            }
        }

        Double limit = job.limit();
        StringBuilder out = new StringBuilder("{\n");
        out.append("  \"peer\": \"Apache Flink\",\n");
        out.append("  \"suite\": \"mainjob\",\n");
        out.append("  \"command\": ").append(str(command)).append(",\n");
        out.append("  \"flink_version\": ").append(str(EnvironmentInformation.getVersion())).append(",\n");
        out.append("  \"java_version\": ")
                .append(str(System.getProperty("java.vm.name") + " " + System.getProperty("java.runtime.version")))
                .append(",\n");
        out.append("  \"rounds\": ").append(rounds).append(",\n");
        out.append("  \"scale\": ").append(num(scale)).append(",\n");
        out.append("  \"job\": ").append(str(job.describe())).append(",\n");
        out.append("  \"settings\": {\"records\": ").append(n)
                .append(", \"warmup_records\": ").append(warmup > 0 ? warm : 0)
                .append(", \"jvm_warmup_runs\": ").append(warmup)
                .append(", \"jvm_warmup_records\": ").append(jvmWarm)
                .append(", \"keys\": ").append(job.keys())
                .append(", \"capacity\": ").append(job.capacity())
                .append(", \"parallelism\": ").append(job.parallelism())
                .append(", \"mode\": \"unordered\"")
                .append(", \"timeout_ms\": ").append(job.timeoutMs())
                .append(", \"buffer_timeout_ms\": ").append(job.bufferTimeoutMs())
                .append(", \"lookup_addr\": ").append(str(job.addr()))
                .append(", \"lookup_latency\": ").append(str(job.latency()))
                .append(", \"value_size\": ").append(job.valueSize())
                .append("},\n");
        out.append("  \"limit_records_per_s\": ").append(limit == null ? "null" : num(limit)).append(",\n");
        out.append("  \"cluster_start_ms\": ").append(num(clusterStartMs)).append(",\n");
        out.append("  \"setup\": ")
                .append(str("one in-process MiniCluster (1 task manager, " + job.parallelism() + " slots, "
                        + NETWORK_MEMORY.getMebiBytes() + " MiB network memory, 32 KiB segments), object reuse on, "
                        + "no checkpointing, no restart strategy, streaming mode; the lookup service is an external "
                        + "process (weir serve-lookup), so its CPU is not in cpu_per_record_ns; first " + warmup + " JVM warm-up "
                        + "runs of " + jvmWarm + " records (JIT), then per round one warm-up run of "
                        + (warmup > 0 ? warm : 0) + " records and the measured run; elapsed_s and the "
                        + "throughput are from the first record generated (or the last sink's start, if later) to "
                        + "the last record at a sink, start-up (submission to first record) reported apart as "
                        + "startup_ms; latency is sink arrival − created_ns (System.nanoTime() when the generator made "
                        + "the record), exact percentiles over every record (the ceil(q·n)-th smallest); "
                        + "cpu_per_record_ns is the process CPU time (getProcessCpuTime, all threads) from submission "
                        + "to the job's result ÷ records, cpu_per_record_ns_steady the same over the window of "
                        + "elapsed_s (first record generated to the last sink's end of input)"))
                .append(",\n");
        out.append("  \"machine\": ").append(machineJson()).append(",\n");
        out.append("  \"results\": [");
        for (int i = 0; i < runs.size(); i++) {
            MainRun r = runs.get(i);
            out.append(i > 0 ? "," : "").append("\n    {\n");
            out.append("      \"name\": ").append(str(job.name())).append(",\n");
            out.append("      \"round\": ").append(i + 1).append(",\n");
            out.append("      \"is_weir\": false,\n");
            out.append("      \"records\": ").append(r.records()).append(",\n");
            out.append("      \"unique\": ").append(r.unique()).append(",\n");
            out.append("      \"duplicated\": ").append(r.duplicated()).append(",\n");
            out.append("      \"lost\": ").append(r.lost()).append(",\n");
            out.append("      \"elapsed_s\": ").append(num(r.elapsedNs() / 1e9)).append(",\n");
            out.append("      \"throughput_records_per_s\": ").append(num(r.throughput())).append(",\n");
            out.append("      \"fraction_of_limit\": ").append(limit == null ? "null" : num(r.throughput() / limit)).append(",\n");
            out.append("      \"latency_ns\": ").append(latencyJson(r)).append(",\n");
            out.append("      \"cpu_per_record_ns\": ").append(num(r.cpuPerRecordNs())).append(",\n");
            out.append("      \"cpu_per_record_ns_steady\": ").append(num((double) r.cpuSteadyNs() / r.records())).append(",\n");
            out.append("      \"cpu_s\": ").append(num(r.cpuNs() / 1e9)).append(",\n");
            out.append("      \"startup_ms\": ").append(num(r.startupNs() / 1e6)).append(",\n");
            out.append("      \"finish_ms\": ").append(num(r.finishNs() / 1e6)).append(",\n");
            out.append("      \"round_s\": ").append(num(roundSeconds.get(i))).append(",\n");
            out.append("      \"lookup_client\": {\"connections\": ").append(r.connections())
                    .append(", \"requests\": ").append(r.requests())
                    .append(", \"writes\": ").append(r.writes())
                    .append(", \"requests_per_write\": ").append(num((double) r.requests() / Math.max(r.writes(), 1)))
                    .append(", \"io_thread_wakeups\": ").append(r.wakeups())
                    .append(", \"reads\": ").append(r.reads())
                    .append(", \"responses_per_read\": ").append(num((double) r.requests() / Math.max(r.reads(), 1)))
                    .append("},\n");
            if (i < warmups.size()) {
                MainRun w = warmups.get(i);
                out.append("      \"warmup\": {\"records\": ").append(w.records())
                        .append(", \"throughput_records_per_s\": ").append(num(w.throughput()))
                        .append(", \"latency_ns\": ").append(latencyJson(w))
                        .append(", \"cpu_per_record_ns\": ").append(num(w.cpuPerRecordNs()))
                        .append("},\n");
            }
            out.append("      \"capacity\": ").append(job.capacity()).append(",\n");
            out.append("      \"parallelism\": ").append(job.parallelism()).append("\n");
            out.append("    }");
        }
        out.append("\n  ],\n");
        out.append("  \"median\": {\"name\": ").append(str(job.name()))
                .append(", \"rounds\": ").append(runs.size())
                .append(", \"throughput_records_per_s\": ")
                .append(num(median(runs.stream().map(MainRun::throughput).toList())))
                .append(", \"latency_ns\": {\"p50\": ")
                .append(num(median(runs.stream().map(r -> (double) r.quantileNs(0.5)).toList())))
                .append(", \"p99\": ")
                .append(num(median(runs.stream().map(r -> (double) r.quantileNs(0.99)).toList())))
                .append("}, \"cpu_per_record_ns\": ")
                .append(num(median(runs.stream().map(MainRun::cpuPerRecordNs).toList())))
                .append("}\n}\n");
        if (json != null) {
            Path path = Path.of(json);
            if (path.getParent() != null) {
                Files.createDirectories(path.getParent());
            }
            Files.writeString(path, out.toString(), StandardCharsets.UTF_8);
        } else {
            System.out.print(out);
        }
    }

    // ---------------------------------------------------------------- keyed state snapshots

    /** Bytes of one keyed state entry, as Weir's keyed snapshot counts them (8 + 92). */
    static final long KEYED_ENTRY_BYTES = 100;

    /**
     * The keyed suite's source: `entries` keys first (0 .. entries, filling the state),
     * then writes to 1% of the keys per second, spread over the state as Weir's are
     * ((i × 97 + round) mod entries), paced by a 1 ms sleep per thousandth of them.
     */
    static final class KeyedRecords implements GeneratorFunction<Long, Long> {
        final long entries;
        final long perMs;

        KeyedRecords(long entries) {
            this.entries = entries;
            this.perMs = Math.max(entries / 100 / 1000, 1);
        }

        @Override
        public Long map(Long index) throws Exception {
            if (index < entries) {
                return index;
            }
            long write = index - entries;
            if (write % perMs == 0) {
                Thread.sleep(1);
            }
            return (write * 97 + write / Math.max(entries / 100, 1)) % entries;
        }
    }

    /** One ValueState of 92 bytes per key, written at every record (heap backend). */
    static final class KeyedWriter extends KeyedProcessFunction<Long, Long, Long> {
        transient ValueState<byte[]> value;

        @Override
        public void open(OpenContext context) {
            value = getRuntimeContext()
                    .getState(new ValueStateDescriptor<>("value", PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO));
        }

        @Override
        public void processElement(Long key, Context context, Collector<Long> out) throws Exception {
            byte[] bytes = new byte[92];
            java.util.Arrays.fill(bytes, (byte) key.longValue());
            value.update(bytes);
        }
    }

    /**
     * The keyed suite: for 10 MB, 100 MB and 1 GB of keyed state in one subtask (100-byte
     * entries, as Weir's keyed snapshot), the job fills the state, then writes 1% of the
     * keys a second for `seconds` while aligned checkpoints come every second
     * (HashMapStateBackend, file:// storage in a fresh temp directory, max 1
     * concurrent). From the checkpoint statistics of every checkpoint that holds the
     * whole state: the keyed subtask's synchronous part (the task's pause), its
     * asynchronous part, and the end-to-end duration. --scale below 1: 10 and 100 MB.
     */
    static void keyedSnapshots(double scale, String json, String command) throws Exception {
        long[] sizes = scale < 1 ? new long[] {10_000_000L, 100_000_000L} : new long[] {10_000_000L, 100_000_000L, 1_000_000_000L};
        Configuration conf = new Configuration();
        conf.set(TaskManagerOptions.NETWORK_MEMORY_MIN, NETWORK_MEMORY);
        conf.set(TaskManagerOptions.NETWORK_MEMORY_MAX, NETWORK_MEMORY);
        conf.set(TaskManagerOptions.MANAGED_MEMORY_SIZE, MemorySize.parse("64mb"));
        conf.set(WebOptions.CHECKPOINTS_HISTORY_SIZE, 1000);
        MiniClusterConfiguration config =
                new MiniClusterConfiguration.Builder()
                        .setConfiguration(conf)
                        .setNumTaskManagers(1)
                        .setNumSlotsPerTaskManager(1)
                        .withRandomPorts()
                        .build();
        StringBuilder rows = new StringBuilder();
        try (MiniCluster cluster = new MiniCluster(config)) {
            cluster.start();
            for (long size : sizes) {
                long entries = size / KEYED_ENTRY_BYTES;
                // Long enough for some checkpoints of the whole state after the fill.
                long seconds = size >= 1_000_000_000L ? 40 : size >= 100_000_000L ? 12 : 6;
                long writes = Math.max(entries / 100, 1) * seconds;
                Path dir = Files.createTempDirectory("weir-flink-keyed-");
                try {
                    Configuration jobConf = new Configuration();
                    jobConf.set(ExecutionOptions.RUNTIME_MODE, RuntimeExecutionMode.STREAMING);
                    jobConf.set(StateBackendOptions.STATE_BACKEND, "hashmap");
                    jobConf.set(CheckpointingOptions.CHECKPOINT_STORAGE, "filesystem");
                    jobConf.set(CheckpointingOptions.CHECKPOINTS_DIRECTORY, dir.toUri().toString());
                    jobConf.set(CheckpointingOptions.CHECKPOINTING_INTERVAL, Duration.ofSeconds(1));
                    jobConf.set(CheckpointingOptions.CHECKPOINTING_CONSISTENCY_MODE, CheckpointingMode.EXACTLY_ONCE);
                    jobConf.set(CheckpointingOptions.MAX_CONCURRENT_CHECKPOINTS, 1);
                    StreamExecutionEnvironment env = new StreamExecutionEnvironment(jobConf);
                    env.setParallelism(1);
                    DataGeneratorSource<Long> generator =
                            new DataGeneratorSource<>(new KeyedRecords(entries), entries + writes, Types.LONG);
                    env.fromSource(generator, WatermarkStrategy.noWatermarks(), "keys")
                            .keyBy(k -> k, Types.LONG)
                            .process(new KeyedWriter())
                            .name("keyed state")
                            .sinkTo(new DiscardingSink<>());
                    JobGraph graph = env.getStreamGraph().getJobGraph();
                    JobID id = cluster.submitJob(graph).get().getJobID();
                    JobResult result = cluster.requestJobResult(id).get();
                    if (!result.isSuccess()) {
                        Throwable cause =
                                result.getSerializedThrowable()
                                        .map(t -> t.deserializeError(WeirFlinkPeer.class.getClassLoader()))
                                        .orElse(new IllegalStateException("job failed"));
                        throw new IllegalStateException("keyed state of " + size + " B: job failed", cause);
                    }
                    AccessExecutionGraph archived = cluster.getArchivedExecutionGraph(id).get();
                    List<Double> sync = new ArrayList<>();
                    List<Double> async = new ArrayList<>();
                    List<Double> total = new ArrayList<>();
                    List<Double> stateSizes = new ArrayList<>();
                    List<AbstractCheckpointStats> history =
                            new ArrayList<>(archived.getCheckpointStatsSnapshot().getHistory().getCheckpoints());
                    // Checkpoints of the whole state only: within 1% of the largest the run
                    // took (every key written; one taken during the fill holds fewer).
                    long largest = 0;
                    for (AbstractCheckpointStats checkpoint : history) {
                        if (checkpoint instanceof CompletedCheckpointStats completed) {
                            largest = Math.max(largest, completed.getStateSize());
                        }
                    }
                    long whole = largest - largest / 100;
                    for (AbstractCheckpointStats checkpoint : history) {
                        if (!(checkpoint instanceof CompletedCheckpointStats completed)
                                || completed.getStateSize() < whole) {
                            continue;
                        }
                        for (TaskStateStats task : completed.getAllTaskStateStats()) {
                            for (SubtaskStateStats subtask : task.getSubtaskStats()) {
                                // The keyed subtask (the source's state is a few bytes).
                                if (subtask != null && subtask.getStateSize() >= whole / 2) {
                                    sync.add((double) subtask.getSyncCheckpointDuration());
                                    async.add((double) subtask.getAsyncCheckpointDuration());
                                }
                            }
                        }
                        total.add((double) completed.getEndToEndDuration());
                        stateSizes.add((double) completed.getStateSize());
                    }
                    System.err.printf(
                            Locale.ROOT,
                            "flink keyed state of %d MB: %d checkpoints of the whole state; sync p50 %s ms, async p50 %s ms, total p50 %s ms%n",
                            size / 1_000_000,
                            total.size(),
                            num(median(sync)),
                            num(median(async)),
                            num(median(total)));
                    if (rows.length() > 0) {
                        rows.append(",\n");
                    }
                    rows.append("    {\"size_bytes\": ").append(size)
                            .append(", \"entries\": ").append(entries)
                            .append(", \"seconds_of_writes\": ").append(seconds)
                            .append(", \"checkpoints\": ").append(total.size())
                            .append(", \"sync_ms\": ").append(list(sync))
                            .append(", \"async_ms\": ").append(list(async))
                            .append(", \"total_ms\": ").append(list(total))
                            .append(", \"state_size_bytes\": ").append(list(stateSizes))
                            .append("}");
                } finally {
                    awaitDiscarded(dir);
                    deleteTree(dir);
                }
            }
        }
        String out = "{\n  \"peer\": \"Apache Flink\",\n  \"flink\": \"" + EnvironmentInformation.getVersion()
                + "\",\n  \"command\": \"" + command.replace("\"", "'")
                + "\",\n  \"machine\": " + machineJson()
                + ",\n  \"job\": \"DataGeneratorSource(the keys once, then 1% of them a second) → keyBy → KeyedProcessFunction "
                + "(one ValueState<byte[92]> per key, written at every record), parallelism 1; aligned checkpoints every 1 s, "
                + "HashMapStateBackend, file:// storage in a fresh temp directory, max 1 concurrent\",\n"
                + "  \"results\": [\n" + rows + "\n  ]\n}\n";
        if (json != null) {
            Path path = Path.of(json);
            if (path.getParent() != null) {
                Files.createDirectories(path.getParent());
            }
            Files.writeString(path, out, StandardCharsets.UTF_8);
        } else {
            System.out.print(out);
        }
    }

    // ---------------------------------------------------------------- bytes in flight

    /**
     * Keeps the gauges of the bytes in the exchange between the checkpoint jobs' sources
     * and sinks, for InFlightSampler to read: every source subtask's
     * `Shuffle.Netty.Output.Buffers.outputQueueSize` (bytes in its subpartitions, not yet
     * taken by a consumer or sent) and every sink subtask's
     * `Shuffle.Netty.Input.Buffers.inputQueueSize` (bytes received on its remote
     * channels, not yet read; a local channel reads the producer's subpartition, so it
     * counts 0 here). Flink makes the reporter from its factory, named in the cluster's
     * configuration and listed as a service (scripts/flink-peer.sh writes the entry).
     */
    public static final class InFlightReporter implements org.apache.flink.metrics.reporter.MetricReporter {
        static final java.util.concurrent.ConcurrentHashMap<String, org.apache.flink.metrics.Gauge<?>> GAUGES =
                new java.util.concurrent.ConcurrentHashMap<>();

        @Override
        public void open(org.apache.flink.metrics.MetricConfig config) {}

        @Override
        public void close() {}

        @Override
        public void notifyOfAddedMetric(org.apache.flink.metrics.Metric metric, String name, org.apache.flink.metrics.MetricGroup group) {
            String task = group.getAllVariables().getOrDefault("<task_name>", "");
            boolean sinkInput = name.equals("inputQueueSize") && task.contains("sink");
            boolean sourceOutput = name.equals("outputQueueSize") && task.contains("records");
            if ((sinkInput || sourceOutput) && metric instanceof org.apache.flink.metrics.Gauge<?> gauge) {
                GAUGES.put(group.getMetricIdentifier(name), gauge);
            }
        }

        @Override
        public void notifyOfRemovedMetric(org.apache.flink.metrics.Metric metric, String name, org.apache.flink.metrics.MetricGroup group) {
            GAUGES.remove(group.getMetricIdentifier(name));
        }
    }

    /** Makes the InFlightReporter (metrics.reporter.weirinflight.factory.class). */
    public static final class InFlightReporterFactory implements org.apache.flink.metrics.reporter.MetricReporterFactory {
        @Override
        public org.apache.flink.metrics.reporter.MetricReporter createMetricReporter(java.util.Properties properties) {
            return new InFlightReporter();
        }
    }

    /**
     * Every 10 ms while a run lasts, the bytes in the exchange (the sum of
     * InFlightReporter's gauges), as Weir's checkpoint bench samples its sinks' bytes in
     * flight.
     */
    static final class InFlightSampler {
        final List<Double> samples = java.util.Collections.synchronizedList(new ArrayList<>());
        volatile boolean done;
        Thread thread;

        /**
         * `remote`: every channel crosses the network, and only the sinks' input queues
         * are read (what arrived and was not yet read), as Weir counts its remote
         * channels; a source's output queue would add what waits for credit, which
         * Weir's figure leaves out.
         */
        static InFlightSampler start(boolean remote) {
            InFlightSampler sampler = new InFlightSampler();
            sampler.thread = new Thread(() -> {
                while (!sampler.done) {
                    try {
                        Thread.sleep(10);
                    } catch (InterruptedException stop) {
                        return;
                    }
                    // From the first record on (deployment is not part of the run).
                    if (FIRST_INPUT.get() == Long.MAX_VALUE) {
                        continue;
                    }
                    double total = 0;
                    boolean any = false;
                    for (java.util.Map.Entry<String, org.apache.flink.metrics.Gauge<?>> entry :
                            InFlightReporter.GAUGES.entrySet()) {
                        if (remote && !entry.getKey().endsWith("inputQueueSize")) {
                            continue;
                        }
                        if (entry.getValue().getValue() instanceof Number bytes) {
                            total += bytes.doubleValue();
                            any = true;
                        }
                    }
                    if (any) {
                        sampler.samples.add(total);
                    }
                }
            }, "in-flight sampler");
            sampler.thread.setDaemon(true);
            sampler.thread.start();
            return sampler;
        }

        List<Double> stop() throws InterruptedException {
            done = true;
            thread.join();
            synchronized (samples) {
                return new ArrayList<>(samples);
            }
        }
    }

    public static void main(String[] args) throws Exception {
        String suite = "async";
        int rounds = 7;
        int warmup = 2;
        double scale = 1.0;
        String json = null;
        String command = "scripts/flink-peer.sh";
        // The mainjob suite's.
        long records = 2_000_000;
        int capacity = 1000;
        long keys = 1_000_000;
        String lookupAddr = "127.0.0.1:7979";
        String lookupLatency = "fixed:1ms";
        int valueSize = 32;
        long bufferTimeoutMs = 1;
        // Only the cases whose "experiment / implementation" contains this (all when null).
        String only = null;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--records" -> records = Long.parseLong(args[++i]);
                case "--capacity" -> capacity = Integer.parseInt(args[++i]);
                case "--keys" -> keys = Long.parseLong(args[++i]);
                case "--lookup-addr" -> lookupAddr = args[++i];
                case "--lookup-latency" -> lookupLatency = args[++i];
                case "--value-size" -> valueSize = Integer.parseInt(args[++i]);
                case "--buffer-timeout-ms" -> bufferTimeoutMs = Long.parseLong(args[++i]);
                case "--suite" -> suite = args[++i];
                case "--rounds" -> rounds = Integer.parseInt(args[++i]);
                case "--warmup" -> warmup = Integer.parseInt(args[++i]);
                case "--scale" -> scale = Double.parseDouble(args[++i]);
                case "--json" -> json = args[++i];
                case "--command" -> command = args[++i];
                case "--only" -> only = args[++i];
                default -> throw new IllegalArgumentException("unknown argument " + args[i]);
            }
        }
        if (suite.equals("keyed")) {
            keyedSnapshots(scale, json, command);
            System.exit(0);
        }
        if (suite.equals("mainjob")) {
            int colon = lookupAddr.lastIndexOf(':');
            if (colon < 0 || records < 1 || capacity < 1 || keys < 1) {
                throw new IllegalArgumentException(
                        "--lookup-addr needs host:port, --records, --capacity and --keys at least 1");
            }
            MainJob job = new MainJob(
                    records,
                    capacity,
                    keys,
                    lookupAddr.substring(0, colon),
                    Integer.parseInt(lookupAddr.substring(colon + 1)),
                    lookupLatency,
                    valueSize,
                    bufferTimeoutMs,
                    SLOTS,
                    1_000);
            try {
                mainJob(job, rounds, warmup, scale, json, command);
            } catch (Throwable failed) {
                // Exit for certain (no thread left behind keeps the JVM up): the script
                // reports the failure.
                failed.printStackTrace();
                // One line with every cause's message, last: the script quotes the tail.
                StringBuilder why = new StringBuilder();
                for (Throwable t = failed; t != null; t = t.getCause() == t ? null : t.getCause()) {
                    String message = t.getMessage() != null ? t.getMessage() : t.toString();
                    if (why.indexOf(message) < 0) {
                        why.append(why.length() > 0 ? " ← " : "").append(message);
                    }
                }
                System.err.println("mainjob failed: " + why);
                System.exit(1);
            }
            System.exit(0);
        }
        List<Case> cases =
                switch (suite) {
                    case "async" -> asyncCases(scale);
                    case "exchange" -> exchangeCases(scale);
                    case "remote" -> remoteCases(scale);
                    case "checkpoints" -> checkpointCases(scale);
                    default -> throw new IllegalArgumentException("unknown suite " + suite);
                };
        if (only != null) {
            String wanted = only;
            cases = new ArrayList<>(cases);
            cases.removeIf(c -> !(c.experiment() + " / " + c.implementation()).contains(wanted));
            if (cases.isEmpty()) {
                throw new IllegalArgumentException("no case of suite " + suite + " matches --only " + wanted);
            }
        }

        boolean remote = suite.equals("remote");
        boolean checkpointing = suite.equals("checkpoints");
        List<List<Double>> samples = new ArrayList<>();
        List<List<Double>> startups = new ArrayList<>();
        List<List<Double>> finishes = new ArrayList<>();
        List<long[]> latencies = new ArrayList<>();
        List<Placement> placements = new ArrayList<>();
        List<List<CheckpointRun>> checkpointRuns = new ArrayList<>();
        int[] verified = new int[cases.size()];
        int[][] retried = new int[cases.size()][1];
        for (Case c : cases) {
            samples.add(new ArrayList<>());
            startups.add(new ArrayList<>());
            finishes.add(new ArrayList<>());
            latencies.add(new long[0]);
            placements.add(null);
            checkpointRuns.add(new ArrayList<>());
        }
        // One MiniCluster per shape: 1 task manager of SLOTS slots, or (remote) 2 task
        // managers of P slots each for the cases of parallelism P; buffer debloating on or
        // off. The shapes run one after the other, except in the checkpoints suite, whose
        // clusters are all up at once so that every case runs in turn in every round.
        List<Shape> shapes = new ArrayList<>();
        for (Case c : cases) {
            if (!shapes.contains(c.shape())) {
                shapes.add(c.shape());
            }
        }
        List<List<Shape>> groups = new ArrayList<>();
        if (checkpointing) {
            groups.add(shapes);
        } else {
            for (Shape shape : shapes) {
                groups.add(List.of(shape));
            }
        }
        List<String> clusterStarts = new ArrayList<>();
        double clusterStartMs = 0;
        for (List<Shape> group : groups) {
            java.util.Map<Shape, MiniCluster> clusters = new java.util.HashMap<>();
            try {
                for (Shape shape : group) {
                    int taskManagers = shape.slots() > 0 ? 2 : 1;
                    int slots = shape.slots() > 0 ? shape.slots() : SLOTS;
                    long clusterStart = System.nanoTime();
                    Configuration conf = new Configuration();
                    conf.set(TaskManagerOptions.NETWORK_MEMORY_MIN, NETWORK_MEMORY);
                    conf.set(TaskManagerOptions.NETWORK_MEMORY_MAX, NETWORK_MEMORY);
                    conf.set(TaskManagerOptions.MANAGED_MEMORY_SIZE, MemorySize.parse("64mb"));
                    if (shape.debloat()) {
                        conf.set(TaskManagerOptions.BUFFER_DEBLOAT_ENABLED, true);
                    }
                    // Every checkpoint of a run in its history (the default keeps 10).
                    conf.set(WebOptions.CHECKPOINTS_HISTORY_SIZE, 1000);
                    // The sources' output and the sinks' input queue sizes, read every
                    // 10 ms (InFlightSampler).
                    conf.set(
                            org.apache.flink.configuration.ConfigOptions.key("metrics.reporter.weirinflight.factory.class")
                                    .stringType()
                                    .noDefaultValue(),
                            InFlightReporterFactory.class.getName());
                    MiniClusterConfiguration config =
                            new MiniClusterConfiguration.Builder()
                                    .setConfiguration(conf)
                                    .setNumTaskManagers(taskManagers)
                                    .setNumSlotsPerTaskManager(slots)
                                    .withRandomPorts()
                                    .build();
                    MiniCluster cluster = new MiniCluster(config);
                    clusters.put(shape, cluster);
                    cluster.start();
                    double ms = (System.nanoTime() - clusterStart) / 1e6;
                    clusterStartMs += ms;
                    String debloat = shape.debloat() ? ", buffer debloating on" : "";
                    clusterStarts.add(String.format(Locale.ROOT, "%d × %d slots%s: %.0f ms", taskManagers, slots, debloat, ms));
                    System.err.printf(
                            Locale.ROOT,
                            "flink %s: MiniCluster of %d task manager%s with %d slot%s each%s up in %.0f ms%n",
                            EnvironmentInformation.getVersion(),
                            taskManagers,
                            taskManagers > 1 ? "s" : "",
                            slots,
                            slots > 1 ? "s" : "",
                            debloat,
                            ms);
                }
                // The first `warmup` rounds warm the JIT and are discarded.
                for (int round = 1 - warmup; round <= rounds; round++) {
                    for (int k = 0; k < cases.size(); k++) {
                        Case c = cases.get(k);
                        MiniCluster cluster = clusters.get(c.shape());
                        if (cluster == null) {
                            continue;
                        }
                        Turn turn = run(cluster, c, retried[k]);
                        System.err.printf(
                                Locale.ROOT,
                                "%s %-70s %-16s %12.0f records/s  start-up %5.0f ms%n",
                                round <= 0 ? "warm-up " : "round " + round + " ",
                                c.experiment,
                                c.implementation,
                                1e9 / turn.nsPerOp,
                                turn.startupNs / 1e6);
                        if (turn.placement != null) {
                            if (placements.get(k) == null) {
                                System.err.println("  placement: " + turn.placement.describe());
                            }
                            placements.set(k, turn.placement);
                            verified[k]++;
                        }
                        if (turn.checkpoints != null) {
                            System.err.println("  checkpoints: " + turn.checkpoints.describe());
                            for (String failure : turn.checkpoints.failures()) {
                                System.err.println("  failed checkpoint " + failure);
                            }
                        }
                        if (round <= 0) {
                            continue;
                        }
                        samples.get(k).add(turn.nsPerOp);
                        startups.get(k).add(turn.startupNs / 1e6);
                        finishes.get(k).add(turn.finishNs / 1e6);
                        long[] all = latencies.get(k);
                        long[] merged = Arrays.copyOf(all, all.length + turn.latencies);
                        System.arraycopy(turn.latency, 0, merged, all.length, turn.latencies);
                        latencies.set(k, merged);
                        if (turn.checkpoints != null) {
                            checkpointRuns.get(k).add(turn.checkpoints);
                        }
                    }
                }
            } finally {
                for (MiniCluster cluster : clusters.values()) {
                    cluster.close();
                }
            }
        }

        StringBuilder out = new StringBuilder("{\n");
        out.append("  \"command\": ").append(str(command)).append(",\n");
        out.append("  \"rounds\": ").append(rounds).append(",\n");
        out.append("  \"peer\": \"Apache Flink\",\n");
        out.append("  \"flink_version\": ").append(str(EnvironmentInformation.getVersion())).append(",\n");
        out.append("  \"java_version\": ")
                .append(str(System.getProperty("java.vm.name") + " " + System.getProperty("java.runtime.version")))
                .append(",\n");
        out.append("  \"cluster_start_ms\": ").append(num(clusterStartMs)).append(",\n");
        if (clusterStarts.size() > 1) {
            out.append("  \"cluster_starts\": ").append(str(String.join(", ", clusterStarts))).append(",\n");
        }
        long intervalMs =
                cases.stream().filter(c -> c.checkpoints != null).mapToLong(c -> c.checkpoints.intervalMs).max().orElse(0);
        if (checkpointing) {
            out.append("  \"checkpoint_interval_ms\": ").append(intervalMs).append(",\n");
        }
        out.append("  \"setup\": ")
                .append(str(checkpointing
                        ? "two in-process MiniClusters, both up for the whole run so that every case runs in turn "
                                + "in every round: 1 task manager, " + SLOTS + " slots, "
                                + NETWORK_MEMORY.getMebiBytes() + " MiB network memory, 32 KiB segments each, "
                                + "the second with buffer debloating on (taskmanager.network.memory.buffer-debloat.enabled: "
                                + "true, default target and period) for the debloating case only; object reuse on, "
                                + "streaming mode; where a case checkpoints: every " + every(intervalMs)
                                + (intervalMs < 1000 ? " (100 ms because of --quick: runs below full size are too short for 1 s)" : "")
                                + ", EXACTLY_ONCE, HashMapStateBackend, checkpoint storage on the local filesystem "
                                + "(a fresh temp directory per run, file://, deleted after), at most 1 concurrent "
                                + "checkpoint, aligned (no timeout) or unaligned; " + warmup + " warm-up runs per "
                                + "configuration, then " + rounds + " rounds; each run's time is from the first "
                                + "record entering the job to the end of input at the sink, start-up "
                                + "(submission to first record) reported apart; the checkpoint figures come from each "
                                + "finished job's CheckpointStatsSnapshot (archived execution graph), over the measured "
                                + "rounds: counts summed, per completed checkpoint its end-to-end duration (trigger "
                                + "to last acknowledgement) and the largest checkpoint start delay (trigger to the "
                                + "subtask's first barrier) and alignment duration (first to last barrier) of any "
                                + "subtask, its in-flight data persisted (unaligned) and its state size, p50 and max "
                                + "over all of them; size_bytes_last is the state size of the last run's last "
                                + "completed checkpoint (typically the final one, taken after the sources "
                                + "finished; for unaligned checkpoints the state size includes the persisted in-flight "
                                + "data); failure_reasons counts the failed checkpoints by Flink's message (task ids "
                                + "left out), those missing from the history (failed before they were registered) "
                                + "apart"
                        : (remote
                                ? "in-process MiniClusters of 2 task managers (P slots each for the cases of parallelism P; "
                                        + NETWORK_MEMORY.getMebiBytes() + " MiB network memory each, 32 KiB segments, "
                                        + "default buffers per channel and floating buffers), the producers in one slot "
                                        + "sharing group and the consumers in another, so that each fills one task manager "
                                        + "and every record crosses Flink's Netty stack over loopback TCP (placement read "
                                        + "back after every run from the execution graph, see each row's placement), "
                                : "one in-process MiniCluster (1 task manager, " + SLOTS + " slots, "
                                        + NETWORK_MEMORY.getMebiBytes() + " MiB network memory, 32 KiB segments), ")
                        + "object reuse on, no checkpointing, streaming mode; " + warmup + " warm-up runs per "
                        + "configuration, then " + rounds + " rounds; each run's time is from the first "
                        + "record entering the job to the end of input at the sink, start-up "
                        + "(submission to first record) reported apart"))
                .append(",\n");
        out.append("  \"machine\": ").append(machineJson()).append(",\n");
        out.append("  \"results\": [");
        for (int k = 0; k < cases.size(); k++) {
            Case c = cases.get(k);
            List<Double> s = samples.get(k);
            double median = median(s);
            out.append(k > 0 ? "," : "").append("\n    {\n");
            out.append("      \"experiment\": ").append(str(c.experiment)).append(",\n");
            out.append("      \"implementation\": ").append(str(c.implementation)).append(",\n");
            out.append("      \"is_weir\": false,\n");
            out.append("      \"job\": ").append(str(c.job)).append(",\n");
            out.append("      \"records_per_run\": ").append(c.ops).append(",\n");
            out.append("      \"median_ns_per_op\": ").append(num(median)).append(",\n");
            out.append("      \"min_ns_per_op\": ").append(num(s.stream().mapToDouble(x -> x).min().orElse(Double.NaN))).append(",\n");
            out.append("      \"max_ns_per_op\": ").append(num(s.stream().mapToDouble(x -> x).max().orElse(Double.NaN))).append(",\n");
            out.append("      \"samples_ns_per_op\": ").append(list(s)).append(",\n");
            out.append("      \"peer_over_weir\": null,\n");
            out.append("      \"limit_ops_per_s\": ").append(c.limit == null ? "null" : num(c.limit)).append(",\n");
            out.append("      \"fraction_of_limit\": ")
                    .append(c.limit == null ? "null" : num(1e9 / median / c.limit))
                    .append(",\n");
            out.append("      \"startup_ms\": {\"median\": ").append(num(median(startups.get(k))))
                    .append(", \"samples\": ").append(list(startups.get(k))).append("},\n");
            out.append("      \"finish_ms\": {\"median\": ").append(num(median(finishes.get(k)))).append("},\n");
            if (checkpointing) {
                out.append("      \"ops_per_s\": ").append(num(1e9 / median)).append(",\n");
                out.append("      \"samples_ops_per_s\": ")
                        .append(list(s.stream().map(x -> 1e9 / x).toList()))
                        .append(",\n");
                out.append("      \"checkpoints\": ").append(checkpointJson(c, checkpointRuns.get(k))).append(",\n");
            }
            Placement where = placements.get(k);
            if (where != null) {
                out.append("      \"placement\": {\"producers_and_consumers_on_different_task_managers\": ")
                        .append(where.remote)
                        .append(", \"task_managers\": ").append(where.taskManagers)
                        .append(", \"runs_checked\": ").append(verified[k])
                        .append(", \"runs_placed_together_and_repeated\": ").append(retried[k][0])
                        .append(", \"subtasks\": [");
                for (int i = 0; i < where.subtasks.size(); i++) {
                    out.append(i > 0 ? ", " : "").append(str(where.subtasks.get(i)));
                }
                out.append("]},\n");
            }
            long[] l = latencies.get(k);
            if (l.length == 0) {
                out.append("      \"latency_ns\": null\n");
            } else {
                Arrays.sort(l);
                out.append("      \"latency_ns\": {\"p50\": ").append(quantile(l, 0.5))
                        .append(", \"p90\": ").append(quantile(l, 0.9))
                        .append(", \"p99\": ").append(quantile(l, 0.99))
                        .append(", \"p99.9\": ").append(quantile(l, 0.999))
                        .append(", \"max\": ").append(l[l.length - 1])
                        .append(", \"count\": ").append(l.length).append("}\n");
            }
            out.append("    }");
        }
        out.append("\n  ]\n}\n");
        if (json != null) {
            Path path = Path.of(json);
            if (path.getParent() != null) {
                Files.createDirectories(path.getParent());
            }
            Files.writeString(path, out.toString(), StandardCharsets.UTF_8);
        } else {
            System.out.print(out);
        }
        // The async functions' threads are stopped in close(); exit promptly anyway.
        System.exit(0);
    }
}
