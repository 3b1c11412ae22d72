//! Lists whose items are checked (against each other, or as a whole) while serde_yaml is still inside each item's
//! mapping, so a refused item's error carries that item's field path and line.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Deserialize a list of mappings, each as a `T`, then pass it through `check(index, item)`, which may refuse it
/// (the message is located at the item) or turn it into a `U`.
pub(crate) fn deserialize_checked_list<'de, D, T, U, F>(
    d: D,
    expecting: &'static str,
    check: F,
) -> Result<Vec<U>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
    F: FnMut(usize, T) -> Result<U, String>,
{
    d.deserialize_seq(ListVisitor {
        expecting,
        check,
        _types: PhantomData,
    })
}

struct ListVisitor<T, U, F> {
    expecting: &'static str,
    check: F,
    _types: PhantomData<fn(T) -> U>,
}

impl<'de, T, U, F> Visitor<'de> for ListVisitor<T, U, F>
where
    T: Deserialize<'de>,
    F: FnMut(usize, T) -> Result<U, String>,
{
    type Value = Vec<U>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a list of {}s", self.expecting)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Vec<U>, A::Error> {
        let mut out = Vec::new();
        while let Some(item) = seq.next_element_seed(ItemSeed {
            expecting: self.expecting,
            check: &mut self.check,
            index: out.len(),
            _types: PhantomData,
        })? {
            out.push(item);
        }
        Ok(out)
    }
}

struct ItemSeed<'a, T, U, F> {
    expecting: &'static str,
    check: &'a mut F,
    index: usize,
    _types: PhantomData<fn(T) -> U>,
}

impl<'de, T, U, F> DeserializeSeed<'de> for ItemSeed<'_, T, U, F>
where
    T: Deserialize<'de>,
    F: FnMut(usize, T) -> Result<U, String>,
{
    type Value = U;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<U, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, T, U, F> Visitor<'de> for ItemSeed<'_, T, U, F>
where
    T: Deserialize<'de>,
    F: FnMut(usize, T) -> Result<U, String>,
{
    type Value = U;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} (a mapping)", self.expecting)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<U, A::Error> {
        let item = T::deserialize(MapAccessDeserializer::new(map))?;
        (self.check)(self.index, item).map_err(de::Error::custom)
    }
}
