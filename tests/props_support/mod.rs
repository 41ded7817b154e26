//! Random JSON for the property tests that feed parsers and tools with anything.

use proptest::prelude::*;
use serde_json::{Map, Value};

/// Any JSON value up to `depth` levels of arrays and objects: scalars of every kind, strings
/// that are either random or taken from `words`, and objects whose keys come from `keys`
/// (give it the names the code under test knows, so that random input gets past its first
/// check often enough to reach the code behind it).
pub fn arb_json(
    depth: u32,
    keys: BoxedStrategy<String>,
    words: BoxedStrategy<String>,
) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,20}".prop_map(Value::String),
        words.prop_map(Value::String),
    ];
    leaf.prop_recursive(depth, 8 * depth, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((keys.clone(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}
