//! Comparisons the profiles share: case-insensitive model-id prefixes and segments, and
//! pinned sampling values.

/// Case-insensitive ASCII prefix test.
pub fn starts_with_ci(s: &str, prefix: &str) -> bool {
    s.get(..prefix.len()).is_some_and(|head| head.eq_ignore_ascii_case(prefix))
}

/// Whether any segment of `model` starts with one of `markers`, the marker not continued by
/// another digit (`glm-5.3` is not `glm-5.30`).
pub fn segment_matches(model: &str, markers: &[&str]) -> bool {
    model.split('/').any(|segment| {
        markers
            .iter()
            .any(|m| starts_with_ci(segment, m) && !segment.as_bytes().get(m.len()).is_some_and(u8::is_ascii_digit))
    })
}

/// f32 equality the way SMG compares pinned sampling values.
pub fn approx_eq(a: f64, b: f32) -> bool {
    ((a as f32) - b).abs() < 1e-6
}
