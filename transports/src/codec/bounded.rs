//! Bounds on what a serde value from the network may cost as it is
//! decoded: its nesting depth (each level is a few stack frames of the
//! shard's thread; a stack overflow aborts the process, it cannot be
//! caught as a panic) and the memory its sequences' and maps' elements
//! take (a decoder's own limit counts the bytes it reads, and an element
//! may take no byte on the wire, or one byte for kilobytes in memory).
//!
//! [`Bounded`] wraps any `serde::Deserializer`, and wraps again every
//! visitor, seed and access it hands on, so every nested value passes
//! through it.

use std::cell::Cell;
use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};

/// What an element counts at least: an element of a zero-size type takes
/// no byte on the wire, so a count of them claimed by a few bytes costs
/// the decoder a loop turn each; charged this much, as many as the memory
/// bound allows take that bound's sixteenth in turns.
const MIN_ELEMENT_CHARGE: usize = 16;

/// How deep a value may nest, and how much its elements may take.
#[derive(Debug)]
pub(crate) struct Limits {
    depth: Cell<usize>,
    max_depth: usize,
    memory_left: Cell<usize>,
    memory: usize,
}

impl Limits {
    /// Values nested at most `max_depth` levels, whose sequences' and
    /// maps' elements take at most `memory` bytes in all (each at least
    /// [`MIN_ELEMENT_CHARGE`], however small its type).
    pub(crate) fn new(max_depth: usize, memory: usize) -> Self {
        Limits {
            depth: Cell::new(0),
            max_depth,
            memory_left: Cell::new(memory),
            memory,
        }
    }

    fn enter<E: de::Error>(&self) -> Result<(), E> {
        let depth = self.depth.get() + 1;
        if depth > self.max_depth {
            return Err(E::custom(format_args!(
                "a value nested deeper than {} levels",
                self.max_depth
            )));
        }
        self.depth.set(depth);
        Ok(())
    }

    fn leave(&self) {
        self.depth.set(self.depth.get().saturating_sub(1));
    }

    /// Counts one element of type `T` decoded, at its size in memory and
    /// at least [`MIN_ELEMENT_CHARGE`].
    fn charge<T, E: de::Error>(&self) -> Result<(), E> {
        let size = std::mem::size_of::<T>().max(MIN_ELEMENT_CHARGE);
        match self.memory_left.get().checked_sub(size) {
            Some(left) => {
                self.memory_left.set(left);
                Ok(())
            }
            None => Err(E::custom(format_args!(
                "elements taking more than {} bytes of memory (the frame's bound)",
                self.memory
            ))),
        }
    }
}

/// A deserializer (or visitor, seed, access) held to [`Limits`].
pub(crate) struct Bounded<'l, T> {
    inner: T,
    limits: &'l Limits,
    /// For a visitor, and the sequence or map access it is handed: whether
    /// its elements are counted against the memory bound. Those of a
    /// collection (`deserialize_seq`, `deserialize_map`) are; the fields
    /// of a struct, tuple or array (which bincode also reads as a
    /// sequence) are not: their memory is their parent's size.
    counted: bool,
}

impl<'l, T> Bounded<'l, T> {
    pub(crate) fn new(inner: T, limits: &'l Limits) -> Self {
        Bounded {
            inner,
            limits,
            counted: false,
        }
    }

    fn wrap<U>(&self, inner: U) -> Bounded<'l, U> {
        Bounded {
            inner,
            limits: self.limits,
            counted: self.counted,
        }
    }

    fn wrap_counted<U>(&self, inner: U, counted: bool) -> Bounded<'l, U> {
        Bounded {
            inner,
            limits: self.limits,
            counted,
        }
    }
}

/// Forwards `deserialize_*` methods, one level deeper, with the visitor
/// bounded (its elements counted when `counted`: a collection's).
macro_rules! forward_deserialize {
    ($($method:ident($($arg:ident: $ty:ty),*) $counted:literal;)*) => {$(
        fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, D::Error> {
            self.limits.enter()?;
            let visitor = self.wrap_counted(visitor, $counted);
            let value = self.inner.$method($($arg,)* visitor);
            self.limits.leave();
            value
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Bounded<'_, D> {
    type Error = D::Error;

    forward_deserialize! {
        deserialize_any() true;
        deserialize_bool() false;
        deserialize_i8() false;
        deserialize_i16() false;
        deserialize_i32() false;
        deserialize_i64() false;
        deserialize_i128() false;
        deserialize_u8() false;
        deserialize_u16() false;
        deserialize_u32() false;
        deserialize_u64() false;
        deserialize_u128() false;
        deserialize_f32() false;
        deserialize_f64() false;
        deserialize_char() false;
        deserialize_str() false;
        deserialize_string() false;
        deserialize_bytes() false;
        deserialize_byte_buf() false;
        deserialize_option() false;
        deserialize_unit() false;
        deserialize_unit_struct(name: &'static str) false;
        deserialize_newtype_struct(name: &'static str) false;
        deserialize_seq() true;
        deserialize_tuple(len: usize) false;
        deserialize_tuple_struct(name: &'static str, len: usize) false;
        deserialize_map() true;
        deserialize_struct(name: &'static str, fields: &'static [&'static str]) false;
        deserialize_enum(name: &'static str, variants: &'static [&'static str]) false;
        deserialize_identifier() false;
        deserialize_ignored_any() true;
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// Forwards `visit_*` methods that take a plain value.
macro_rules! forward_visit {
    ($($method:ident($ty:ty);)*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.inner.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Bounded<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(f)
    }

    forward_visit! {
        visit_bool(bool);
        visit_i8(i8);
        visit_i16(i16);
        visit_i32(i32);
        visit_i64(i64);
        visit_i128(i128);
        visit_u8(u8);
        visit_u16(u16);
        visit_u32(u32);
        visit_u64(u64);
        visit_u128(u128);
        visit_f32(f32);
        visit_f64(f64);
        visit_char(char);
        visit_str(&str);
        visit_borrowed_str(&'de str);
        visit_string(String);
        visit_bytes(&[u8]);
        visit_borrowed_bytes(&'de [u8]);
        visit_byte_buf(Vec<u8>);
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        let d = self.wrap(d);
        self.inner.visit_some(d)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        let d = self.wrap(d);
        self.inner.visit_newtype_struct(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        let seq = self.wrap(seq);
        self.inner.visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        let map = self.wrap(map);
        self.inner.visit_map(map)
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        let data = self.wrap(data);
        self.inner.visit_enum(data)
    }
}

/// A seed whose deserializer is bounded.
struct Seed<'l, S> {
    inner: S,
    limits: &'l Limits,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(Bounded::new(d, self.limits))
    }
}

impl<'l, T> Bounded<'l, T> {
    fn seed<S>(&self, inner: S) -> Seed<'l, S> {
        Seed {
            inner,
            limits: self.limits,
        }
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Bounded<'_, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        let seed = self.seed(seed);
        let element = self.inner.next_element_seed(seed)?;
        if self.counted && element.is_some() {
            self.limits.charge::<T::Value, A::Error>()?;
        }
        Ok(element)
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Bounded<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let seed = self.seed(seed);
        let key = self.inner.next_key_seed(seed)?;
        if self.counted && key.is_some() {
            self.limits.charge::<K::Value, A::Error>()?;
        }
        Ok(key)
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        let seed = self.seed(seed);
        let value = self.inner.next_value_seed(seed)?;
        if self.counted {
            self.limits.charge::<T::Value, A::Error>()?;
        }
        Ok(value)
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, 'l, A: EnumAccess<'de>> EnumAccess<'de> for Bounded<'l, A> {
    type Error = A::Error;
    type Variant = Bounded<'l, A::Variant>;

    fn variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<(T::Value, Self::Variant), A::Error> {
        let seed = self.seed(seed);
        let (value, variant) = self.inner.variant_seed(seed)?;
        Ok((value, Bounded::new(variant, self.limits)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Bounded<'_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        let seed = self.seed(seed);
        self.inner.newtype_variant_seed(seed)
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        let visitor = self.wrap(visitor);
        self.inner.tuple_variant(len, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        let visitor = self.wrap(visitor);
        self.inner.struct_variant(fields, visitor)
    }
}
