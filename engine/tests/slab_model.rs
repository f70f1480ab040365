//! Public behaviour of the generational slab: a proptest model against a `HashMap`,
//! with stale keys kept around and replayed after their slots are reused.

use std::collections::HashMap;

use proptest::prelude::*;
use weir_engine::slab::{Key, Slab};

#[derive(Debug, Clone)]
enum Op {
    Insert(u32),
    /// Insert through `Slab::insert_with`.
    InsertWith(u32),
    /// Remove the n-th key ever issued (live or stale).
    Remove(usize),
    /// Look up the n-th key ever issued.
    Get(usize),
    /// Write through the n-th key.
    Set(usize, u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => any::<u32>().prop_map(Op::Insert),
        2 => any::<u32>().prop_map(Op::InsertWith),
        2 => any::<usize>().prop_map(Op::Remove),
        2 => any::<usize>().prop_map(Op::Get),
        1 => (any::<usize>(), any::<u32>()).prop_map(|(k, v)| Op::Set(k, v)),
    ]
}

proptest! {
    /// Live keys reach their value; stale keys (removed, slot possibly reused) reach
    /// nothing; the slab refuses exactly when full and hands the value back.
    #[test]
    fn matches_a_hashmap_and_rejects_stale_keys(capacity in 1usize..8, ops in prop::collection::vec(op(), 0..300)) {
        let mut slab = Slab::new(capacity).unwrap();
        let mut model: HashMap<Key, u32> = HashMap::new();
        let mut issued: Vec<Key> = Vec::new();
        for op in ops {
            match op {
                Op::Insert(v) | Op::InsertWith(v) => {
                    let inserted = if matches!(op, Op::InsertWith(_)) {
                        // Refused, the closure comes back unbuilt: build it to compare.
                        slab.insert_with(|| v).map_err(|make| make())
                    } else {
                        slab.try_insert(v)
                    };
                    match inserted {
                        Ok(key) => {
                            prop_assert!(model.len() < capacity);
                            prop_assert!(!model.contains_key(&key), "a live key was issued twice");
                            prop_assert!(!issued.contains(&key), "a stale key was reissued");
                            model.insert(key, v);
                            issued.push(key);
                        }
                        Err(back) => {
                            prop_assert_eq!(back, v);
                            prop_assert_eq!(model.len(), capacity);
                        }
                    }
                }
                Op::Remove(n) if !issued.is_empty() => {
                    let key = issued[n % issued.len()];
                    prop_assert_eq!(slab.remove(key), model.remove(&key));
                }
                Op::Get(n) if !issued.is_empty() => {
                    let key = issued[n % issued.len()];
                    prop_assert_eq!(slab.get(key), model.get(&key));
                    prop_assert_eq!(slab.contains(key), model.contains_key(&key));
                    prop_assert_eq!(slab.get(Key::from_u64(key.to_u64())), model.get(&key));
                }
                Op::Set(n, v) if !issued.is_empty() => {
                    let key = issued[n % issued.len()];
                    match (slab.get_mut(key), model.get_mut(&key)) {
                        (Some(a), Some(b)) => { *a = v; *b = v; }
                        (None, None) => {}
                        (a, b) => prop_assert!(false, "slab {:?} vs model {:?}", a, b),
                    }
                }
                _ => {}
            }
            prop_assert_eq!(slab.len(), model.len());
            prop_assert_eq!(slab.is_full(), model.len() == capacity);
        }
        let mut live: Vec<(Key, u32)> = slab.iter().map(|(k, v)| (k, *v)).collect();
        let mut expected: Vec<(Key, u32)> = model.into_iter().collect();
        live.sort();
        expected.sort();
        prop_assert_eq!(live, expected);
        slab.clear();
        prop_assert!(slab.is_empty());
    }
}

/// Keys from outside (e.g. a wire request id) that name no slot are rejected, not
/// a panic.
#[test]
fn foreign_keys_are_rejected() {
    let mut slab = Slab::new(2).unwrap();
    let key = slab.try_insert(1u8).unwrap();
    assert_eq!(slab.get(Key::from_u64(u64::MAX)), None);
    assert_eq!(slab.remove(Key::from_u64(7)), None);
    assert_eq!(slab.get(key), Some(&1));
}
