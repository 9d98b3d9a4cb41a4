//! `alias_of`: an entry without a price of its own priced as the entry it names, followed once
//! the whole file is read, through at most [`MAX_ALIAS_HOPS`] links.

use std::collections::HashMap;

use super::load::Loaded;
use super::skipped::SkipReason;

/// The most `alias_of` links followed from one entry (LiteLLM's own are one link).
pub const MAX_ALIAS_HOPS: usize = 8;

impl Loaded {
    /// Prices the aliases met while reading (see the module documentation): called once the
    /// whole document is read.
    pub(super) fn follow_aliases(&mut self) {
        let pending = std::mem::take(&mut self.pending_aliases);
        let links: HashMap<&str, &str> = pending
            .iter()
            .map(|(a, t)| (a.as_str(), t.as_str()))
            .collect();
        // Looked up among the entries priced by their own fields only (an alias priced here is
        // no shortcut for a later one: the hop bound holds whatever the file's order).
        let mut priced = Vec::with_capacity(pending.len());
        for (alias, target) in &pending {
            if self.table.exact(alias).is_some() {
                // The name is also an entry with a price of its own (a key given twice): that
                // price wins, whichever came first.
                continue;
            }
            let mut name = target.as_str();
            let mut price = None;
            for _ in 0..MAX_ALIAS_HOPS {
                if let Some(p) = self.table.exact(name) {
                    price = Some(*p);
                    break;
                }
                match links.get(name) {
                    Some(next) => name = next,
                    None => break,
                }
            }
            match price {
                Some(p) => priced.push((alias.clone(), p)),
                None => self.skipped.add(SkipReason::AliasUnpriced, alias),
            }
        }
        self.aliases = self.aliases.saturating_add(priced.len());
        self.table.extend(priced);
    }
}
