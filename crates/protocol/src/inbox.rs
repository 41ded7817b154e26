//! What waits in a loop's inbox for its model's next turn.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Something waiting in a loop's inbox until its model's next turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InboxItem {
    /// Data another loop shared.
    Share {
        /// Sender.
        from: String,
        /// Kind of data.
        data_type: String,
        /// The data.
        data: Value,
    },
    /// A broadcast alert (from a loop, or `taskdaemon` for system alerts).
    Alert {
        /// Sender.
        from: String,
        /// Event type.
        event_type: String,
        /// Message.
        message: String,
        /// Optional data.
        data: Option<Value>,
        /// For a system alert: the loop it is about (whose start or end it announces).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        about: Option<String>,
    },
}

/// An inbox item with its delivery number: the head's coordinator numbers the items it
/// delivers to each loop (1, 2, 3... per loop, over the whole run and across its moves and
/// resumes), when it decides the delivery. Items are recorded when their delivery settles
/// (after every remote delivery of theirs, up to 10 s), so the record's order of a loop's
/// items is not the order the loop got them in: a resumed or moved loop is shown again
/// exactly the items whose numbers no finished iteration showed, in number order
/// ([`crate::delivery`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivered {
    /// Its number among the items delivered to its loop; `None` for an item without one (a
    /// record older than delivery numbers, a merge queue's hand back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<u64>,
    /// The item.
    #[serde(flatten)]
    pub item: InboxItem,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivered_item_reads_as_the_item_with_its_number_and_an_old_item_without() {
        let item = InboxItem::Share {
            from: "a".into(),
            data_type: "port".into(),
            data: Value::from(8080),
        };
        let numbered = Delivered {
            delivery: Some(7),
            item: item.clone(),
        };
        let text = serde_json::to_string(&numbered).unwrap();
        assert_eq!(serde_json::from_str::<Delivered>(&text).unwrap(), numbered);
        // The item alone, as an older head or record writes it: no number.
        let old = serde_json::to_string(&item).unwrap();
        let read: Delivered = serde_json::from_str(&old).unwrap();
        assert_eq!((read.delivery, read.item), (None, item.clone()));
        // And what an older host reads of a numbered one: the item.
        assert_eq!(serde_json::from_str::<InboxItem>(&text).unwrap(), item);
    }
}
