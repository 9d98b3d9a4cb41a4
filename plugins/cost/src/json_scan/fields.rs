//! What a scan keeps: the members captured ([`Field`]) and their raw JSON text in one buffer
//! ([`Captured`]).

/// The members captured (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `usage`.
    Usage,
    /// `model`.
    Model,
    /// `type`.
    Type,
    /// `choices`.
    Choices,
    /// `message.usage`.
    MessageUsage,
    /// `message.model`.
    MessageModel,
    /// `response.usage`.
    ResponseUsage,
    /// `response.model`.
    ResponseModel,
}

const FIELDS: usize = 8;

/// Every field, in [`Field::index`] order.
const ALL_FIELDS: [Field; FIELDS] = [
    Field::Usage,
    Field::Model,
    Field::Type,
    Field::Choices,
    Field::MessageUsage,
    Field::MessageModel,
    Field::ResponseUsage,
    Field::ResponseModel,
];

impl Field {
    pub(super) fn index(self) -> usize {
        match self {
            Field::Usage => 0,
            Field::Model => 1,
            Field::Type => 2,
            Field::Choices => 3,
            Field::MessageUsage => 4,
            Field::MessageModel => 5,
            Field::ResponseUsage => 6,
            Field::ResponseModel => 7,
        }
    }
}

/// The members captured by a complete scan: their raw JSON text, in one buffer.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    pub(super) text: Vec<u8>,
    /// Each field's value in `text` (start, end), by [`Field::index`].
    pub(super) ranges: [Option<(usize, usize)>; FIELDS],
}

impl Captured {
    /// The raw JSON text of `field`'s value, if the document had it.
    pub fn get(&self, field: Field) -> Option<&[u8]> {
        let (start, end) = (*self.ranges.get(field.index())?)?;
        self.text.get(start..end)
    }

    /// Forgets `field`'s value (a member given again: the last one wins), compacting the buffer
    /// so that it never holds more than one value per field.
    pub(super) fn forget(&mut self, field: Field) {
        let Some((start, end)) = self.ranges.get_mut(field.index()).and_then(Option::take) else {
            return;
        };
        if end >= self.text.len() {
            self.text.truncate(start);
            return;
        }
        if start <= end {
            self.text.drain(start..end);
        }
        let gone = end.saturating_sub(start);
        for (s, e) in self.ranges.iter_mut().flatten() {
            if *s >= end {
                *s = s.saturating_sub(gone);
                *e = e.saturating_sub(gone);
            }
        }
    }
}

impl PartialEq for Captured {
    /// The same members with the same text (wherever each is in the buffer).
    fn eq(&self, other: &Captured) -> bool {
        ALL_FIELDS.iter().all(|&f| self.get(f) == other.get(f))
    }
}

impl Eq for Captured {}
