//! A keyed running count over two stages: words from two source subtasks, keyed by
//! word through key groups (Flink's `keyBy`), counted by three subtasks in keyed state
//! (`map_with_state`, Flink's `ValueState`): each subtask holds the counts of the key
//! groups it owns, and a checkpoint of the job (`Graph::with_checkpointing`) stores
//! them per key group, so that a restore may run the counting stage at another
//! parallelism.
//!
//! `cargo run --release -p weir-engine --example keyed_count`

use std::collections::HashMap;

use weir_engine::graph::keys::subtask_for_key;
use weir_engine::graph::{Graph, SubtaskInfo};
use weir_engine::runtime::{Cores, Runtime};

const TEXT: &str = "the quick brown fox jumps over the lazy dog the fox naps \
                    and the dog barks at the quick fox";

/// A count as it is updated: (word, count so far, counting subtask).
type Count = (String, u64, u64);

/// Every count update.
fn run(repeat: usize) -> Result<Vec<Count>, Box<dyn std::error::Error>> {
    let graph = Graph::new();
    let counts = graph
        .from_iter(move |source: &SubtaskInfo| {
            // Source subtask i reads every other word, from word i.
            let words: Vec<String> = TEXT.split(' ').map(String::from).collect();
            let (index, parallelism) = (source.index, source.parallelism);
            (0..repeat)
                .flat_map(move |_| words.clone().into_iter().skip(index).step_by(parallelism))
        })
        .parallelism(2)
        .key_by(|word: &String| word.clone())
        .parallelism(3)
        .max_parallelism(128)
        .map_with_state(
            |word: &String| word.clone(),
            |word: String, count: &mut Option<u64>| {
                let counted = count.unwrap_or(0) + 1;
                *count = Some(counted);
                let subtask = subtask_for_key(&word, 128, 3) as u64;
                (word, counted, subtask)
            },
        )
        .collect();
    let runtime = Runtime::builder()
        .cores(Cores::Count(2))
        .pin(false)
        .build()?;
    graph.execute(runtime)?;
    Ok(counts.records())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let repeat = std::env::args().nth(1).map_or(Ok(1000), |n| n.parse())?;
    let mut last: HashMap<String, (u64, u64)> = HashMap::new();
    for (word, count, subtask) in run(repeat)? {
        let entry = last.entry(word).or_default();
        entry.0 = entry.0.max(count);
        entry.1 = subtask;
    }
    let mut words: Vec<_> = last.into_iter().collect();
    words.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
    for (word, (count, subtask)) in words {
        println!("{word:>6} {count:>8}  (counted by subtask {subtask})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    #[test]
    fn running_counts_reach_the_word_totals_in_order() {
        let repeat = 50;
        let mut expected: HashMap<&str, u64> = HashMap::new();
        for word in super::TEXT.split(' ') {
            *expected.entry(word).or_default() += repeat as u64;
        }
        let mut seen: HashMap<String, u64> = HashMap::new();
        for (word, count, _) in super::run(repeat).expect("runs") {
            let last = seen.entry(word).or_default();
            // One subtask counts each word: its counts rise by one.
            assert_eq!(count, *last + 1);
            *last = count;
        }
        assert_eq!(seen.len(), expected.len());
        for (word, total) in expected {
            assert_eq!(seen[word], total, "{word}");
        }
    }
}
