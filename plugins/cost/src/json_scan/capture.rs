//! Which values are kept, and copying their text: a member name is matched to a [`Field`] (or
//! to the `message` / `response` object it opens), a value of such a member is captured from its
//! first byte to its last, cut at the head for `choices` and dropped past the bound.

use super::fields::Field;
use super::{Capture, JsonScan, Parent, St, CAPTURE_START, CHOICES_HEAD};

impl JsonScan {
    /// Copies the captured bytes of `chunk` not yet copied, up to `end`, into the capture (cut
    /// at the head for `choices`, dropped past the bound).
    pub(super) fn copy_captured(&mut self, chunk: &[u8], end: usize) {
        let Some(c) = self.capturing else {
            return;
        };
        let bytes = chunk.get(self.mark..end).unwrap_or_default();
        self.mark = end;
        let text = &mut self.captured.text;
        let total = text
            .len()
            .saturating_sub(c.start)
            .saturating_add(bytes.len());
        if c.field == Field::Choices && total > CHOICES_HEAD {
            // Only whether it is empty matters: keep its head, mark it cut, stop.
            let room = CHOICES_HEAD.saturating_sub(text.len().saturating_sub(c.start));
            text.extend_from_slice(bytes.get(..room).unwrap_or(bytes));
            text.extend_from_slice(b"...");
            self.end_capture();
            return;
        }
        if total > self.max_value {
            text.truncate(c.start);
            self.capturing = None;
            self.too_large = true;
            return;
        }
        text.extend_from_slice(bytes);
    }

    /// The captured value is complete: its range is recorded.
    fn end_capture(&mut self) {
        if let Some(c) = self.capturing.take() {
            let end = self.captured.text.len();
            if let Some(slot) = self.captured.ranges.get_mut(c.field.index()) {
                *slot = Some((c.start, end));
            }
        }
    }
    /// A member name is complete (`None`: one that matches nothing): which field or parent it
    /// is.
    pub(super) fn member_named(&mut self, name: Option<&[u8]>) {
        self.key_live = false;
        let name = name.unwrap_or(b"\0");
        match self.depth {
            1 => {
                self.top = match name {
                    b"usage" => Some(Ok(Field::Usage)),
                    b"model" => Some(Ok(Field::Model)),
                    b"type" => Some(Ok(Field::Type)),
                    b"choices" => Some(Ok(Field::Choices)),
                    b"message" => Some(Err(Parent::Message)),
                    b"response" => Some(Err(Parent::Response)),
                    _ => None,
                }
            }
            2 => {
                self.inner = match (self.inner_parent, name) {
                    (Some(Parent::Message), b"usage") => Some(Field::MessageUsage),
                    (Some(Parent::Message), b"model") => Some(Field::MessageModel),
                    (Some(Parent::Response), b"usage") => Some(Field::ResponseUsage),
                    (Some(Parent::Response), b"model") => Some(Field::ResponseModel),
                    _ => None,
                }
            }
            _ => {}
        }
    }

    /// A value starts at `at`: capture it if its member is one.
    pub(super) fn value_start(&mut self, at: usize) {
        let field = match self.depth {
            1 => match self.top {
                Some(Ok(field)) => Some(field),
                Some(Err(parent)) => {
                    // A parent given again: only its last value counts, as for any member.
                    for f in parent.fields() {
                        self.captured.forget(f);
                    }
                    None
                }
                None => None,
            },
            2 if self.inner_parent.is_some() => self.inner,
            _ => return,
        };
        // Only the value of a member (after its colon), not array elements.
        if let (Some(field), Some(true), None) = (field, self.in_object(), self.capturing) {
            self.captured.forget(field);
            if self.captured.text.capacity() == 0 {
                // One allocation for the usual values, not a doubling per few bytes.
                self.captured
                    .text
                    .reserve(CAPTURE_START.min(self.max_value));
            }
            self.capturing = Some(Capture {
                field,
                depth: self.depth,
                start: self.captured.text.len(),
            });
            self.mark = at;
        }
    }

    /// A value has ended just before `end` in `chunk` (the scalar, or the container that
    /// closed).
    pub(super) fn value_end(&mut self, chunk: &[u8], end: usize) {
        if let Some(c) = self.capturing {
            if c.depth == self.depth {
                self.copy_captured(chunk, end);
                self.end_capture();
            }
        }
        self.st = if self.depth == 0 { St::Done } else { St::After };
    }
}
