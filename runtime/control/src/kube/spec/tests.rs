//! Tests of the resource conversion.
