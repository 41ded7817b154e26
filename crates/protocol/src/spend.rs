//! What model calls spent: tokens of each kind (the names of `td_llm::Usage`), the number of
//! calls, and their cost in nano-dollars (10⁻⁹ USD) with the calls that had no price counted
//! apart, so that a cost is never shown as $0 when it is unknown.
//!
//! Figures are read back from run records, which may be damaged or hostile: every sum
//! saturates instead of wrapping.

use serde::{Deserialize, Serialize};

/// Tokens, calls and cost of some model calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "SpendRecord", into = "SpendRecord")]
pub struct Spend {
    /// Prompt tokens billed at the full input rate.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's prompt cache.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's prompt cache.
    pub cache_write_tokens: u64,
    /// Model calls answered.
    pub model_calls: u64,
    /// Cost of the calls whose model has a price, in nano-dollars.
    pub cost_nano_usd: u64,
    /// Calls whose model has no price: their cost is unknown.
    pub unpriced_calls: u64,
    /// Calls whose token counts are estimates (a streamed reply that reported no usage).
    pub estimated_calls: u64,
}

impl Spend {
    /// One call with these token counts, costing `cost` nano-dollars (`None`: unknown price).
    pub fn call(tokens: [u64; 4], cost: Option<u64>) -> Spend {
        let [
            input_tokens,
            output_tokens,
            cache_read_tokens,
            cache_write_tokens,
        ] = tokens;
        Spend {
            input_tokens,
            output_tokens,
            cache_read_tokens,
            cache_write_tokens,
            model_calls: 1,
            cost_nano_usd: cost.unwrap_or(0),
            unpriced_calls: u64::from(cost.is_none()),
            estimated_calls: 0,
        }
    }

    /// Adds `other` (saturating).
    pub fn add(&mut self, other: &Spend) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
        self.model_calls = self.model_calls.saturating_add(other.model_calls);
        self.cost_nano_usd = self.cost_nano_usd.saturating_add(other.cost_nano_usd);
        self.unpriced_calls = self.unpriced_calls.saturating_add(other.unpriced_calls);
        self.estimated_calls = self.estimated_calls.saturating_add(other.estimated_calls);
    }

    /// `self` and `other` added.
    pub fn plus(mut self, other: &Spend) -> Spend {
        self.add(other);
        self
    }

    /// Every token of every kind (what a token budget counts).
    pub fn tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.output_tokens)
            .saturating_add(self.cache_read_tokens)
            .saturating_add(self.cache_write_tokens)
    }

    /// Whether no call was counted.
    pub fn is_empty(&self) -> bool {
        *self == Spend::default()
    }

    /// The cost for people: `$0.1234`, `unknown price` when no call had a price, and
    /// `$0.1234 + unknown price (3 calls)` when some had none; `-` for no call at all. A
    /// figure built on estimated token counts says so (`~$0.1234 (2 calls estimated)`).
    pub fn cost_text(&self) -> String {
        let text = self.cost_text_exact();
        match self.estimated_calls {
            0 => text,
            _ if text == "-" => text,
            n => format!(
                "~{text} ({n} call{} estimated)",
                if n == 1 { "" } else { "s" }
            ),
        }
    }

    fn cost_text_exact(&self) -> String {
        match (self.model_calls, self.unpriced_calls) {
            (0, 0) => "-".to_string(),
            (_, 0) => usd(self.cost_nano_usd),
            (calls, unpriced) if unpriced >= calls && self.cost_nano_usd == 0 => {
                "unknown price".to_string()
            }
            (_, unpriced) => format!(
                "{} + unknown price ({unpriced} call{})",
                usd(self.cost_nano_usd),
                if unpriced == 1 { "" } else { "s" }
            ),
        }
    }
}

/// Nano-dollars as dollars with four decimals (`$0.1001`); amounts below a ten-thousandth
/// of a dollar show as `<$0.0001` rather than as a cost of zero.
pub fn usd(nano: u64) -> String {
    if nano > 0 && nano < 100_000 {
        return "<$0.0001".to_string();
    }
    // Rounded to the ten-thousandth, in integers (no float rounding surprises).
    let tenths_of_mills = nano.saturating_add(50_000) / 100_000;
    format!(
        "${}.{:04}",
        tenths_of_mills / 10_000,
        tenths_of_mills % 10_000
    )
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How a [`Spend`] is written: its fields and `cost` for people (ignored when read).
#[derive(Serialize, Deserialize)]
struct SpendRecord {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_tokens: u64,
    #[serde(default)]
    cache_write_tokens: u64,
    #[serde(default)]
    model_calls: u64,
    #[serde(default)]
    cost_nano_usd: u64,
    #[serde(default)]
    unpriced_calls: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    estimated_calls: u64,
    /// [`Spend::cost_text`], for people reading the record.
    #[serde(default, skip_deserializing)]
    cost: String,
}

impl From<SpendRecord> for Spend {
    fn from(r: SpendRecord) -> Spend {
        Spend {
            input_tokens: r.input_tokens,
            output_tokens: r.output_tokens,
            cache_read_tokens: r.cache_read_tokens,
            cache_write_tokens: r.cache_write_tokens,
            model_calls: r.model_calls,
            cost_nano_usd: r.cost_nano_usd,
            unpriced_calls: r.unpriced_calls,
            estimated_calls: r.estimated_calls,
        }
    }
}

impl From<Spend> for SpendRecord {
    fn from(s: Spend) -> SpendRecord {
        SpendRecord {
            input_tokens: s.input_tokens,
            output_tokens: s.output_tokens,
            cache_read_tokens: s.cache_read_tokens,
            cache_write_tokens: s.cache_write_tokens,
            model_calls: s.model_calls,
            cost_nano_usd: s.cost_nano_usd,
            unpriced_calls: s.unpriced_calls,
            estimated_calls: s.estimated_calls,
            cost: s.cost_text(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_prices_are_never_shown_as_zero() {
        let priced = Spend::call([1000, 100, 0, 0], Some(100_100_000));
        let unpriced = Spend::call([10, 1, 0, 0], None);
        assert_eq!(priced.cost_text(), "$0.1001");
        assert_eq!(unpriced.cost_text(), "unknown price");
        assert_eq!(
            priced.plus(&unpriced).plus(&unpriced).cost_text(),
            "$0.1001 + unknown price (2 calls)"
        );
        assert_eq!(Spend::call([1, 0, 0, 0], Some(3)).cost_text(), "<$0.0001");
        assert_eq!(Spend::call([1, 0, 0, 0], Some(0)).cost_text(), "$0.0000");
        assert_eq!(Spend::default().cost_text(), "-");
        assert_eq!(usd(12_345_678_900), "$12.3457");
        // At the very top the rounding saturates rather than wraps.
        assert_eq!(usd(u64::MAX), "$18446744073.7095");
    }

    #[test]
    fn records_round_trip_and_hostile_figures_saturate() {
        let s = Spend::call([1, 2, 3, 4], None);
        let json = serde_json::to_value(s).unwrap();
        assert_eq!(json["cost"], "unknown price");
        assert_eq!(json["cache_read_tokens"], 3);
        let back: Spend = serde_json::from_value(json).unwrap();
        assert_eq!(back, s);
        // A record's `cost` text is not believed: the figures are.
        let lie: Spend = serde_json::from_str(r#"{"model_calls": 1, "cost": "$0.00"}"#).unwrap();
        assert_eq!(lie.cost_text(), "$0.0000");
        // Counts estimated (a stream without usage) are shown as such and kept.
        let mut guessed = Spend::call([40, 5, 0, 0], Some(2_000_000));
        guessed.estimated_calls = 1;
        assert_eq!(guessed.cost_text(), "~$0.0020 (1 call estimated)");
        let json = serde_json::to_value(guessed).unwrap();
        assert_eq!(json["estimated_calls"], 1);
        assert_eq!(serde_json::from_value::<Spend>(json).unwrap(), guessed);
        assert!(
            serde_json::to_value(Spend::default())
                .unwrap()
                .get("estimated_calls")
                .is_none()
        );
        let mut big: Spend = serde_json::from_str(
            r#"{"input_tokens": 18446744073709551615, "cost_nano_usd": 18446744073709551615}"#,
        )
        .unwrap();
        big.add(&Spend::call([1, 0, 0, 0], Some(1)));
        assert_eq!(big.input_tokens, u64::MAX);
        assert_eq!(big.cost_nano_usd, u64::MAX);
        assert_eq!(big.tokens(), u64::MAX);
    }
}
