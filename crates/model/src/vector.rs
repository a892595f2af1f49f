//! Similarity between two `vector<float, n>` values, as Cassandra 5.0 scores it: the
//! `similarity_cosine`, `similarity_euclidean` and `similarity_dot_product` functions,
//! and the similarity function a vector index orders its nearest neighbours by. Every
//! score is in [0, 1], higher meaning closer:
//!
//! - cosine: `(1 + cos θ) / 2` (undefined for an all-zero vector);
//! - euclidean: `1 / (1 + ‖a − b‖²)`;
//! - dot product: `(1 + a·b) / 2` (meant for unit-length vectors).

/// One of Cassandra's vector similarity functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Similarity {
    Cosine,
    Euclidean,
    DotProduct,
}

/// Why two vectors have no similarity score.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimilarityError {
    /// Cosine similarity of a vector whose elements are all zero.
    ZeroVector,
    /// The vectors have different dimensions.
    Dimensions { left: usize, right: usize },
}

impl Similarity {
    /// The similarity a function or index option names: `cosine`, `euclidean`,
    /// `dot_product` (case-insensitive).
    pub fn named(name: &str) -> Option<Similarity> {
        match name.to_ascii_lowercase().as_str() {
            "cosine" => Some(Similarity::Cosine),
            "euclidean" => Some(Similarity::Euclidean),
            "dot_product" => Some(Similarity::DotProduct),
            _ => None,
        }
    }

    /// The name [`Similarity::named`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Similarity::Cosine => "cosine",
            Similarity::Euclidean => "euclidean",
            Similarity::DotProduct => "dot_product",
        }
    }

    /// The score of `left` against `right`, in [0, 1] (higher is closer).
    pub fn score(self, left: &[f32], right: &[f32]) -> Result<f32, SimilarityError> {
        if left.len() != right.len() {
            return Err(SimilarityError::Dimensions {
                left: left.len(),
                right: right.len(),
            });
        }
        let pairs = left.iter().zip(right);
        Ok(match self {
            Similarity::Cosine => {
                let (mut dot, mut left_norm, mut right_norm) = (0f32, 0f32, 0f32);
                for (a, b) in pairs {
                    dot += a * b;
                    left_norm += a * a;
                    right_norm += b * b;
                }
                if left_norm == 0.0 || right_norm == 0.0 {
                    return Err(SimilarityError::ZeroVector);
                }
                (1.0 + dot / (left_norm * right_norm).sqrt()) / 2.0
            }
            Similarity::Euclidean => {
                let squared: f32 = pairs.map(|(a, b)| (a - b) * (a - b)).sum();
                1.0 / (1.0 + squared)
            }
            Similarity::DotProduct => {
                let dot: f32 = pairs.map(|(a, b)| a * b).sum();
                (1.0 + dot) / 2.0
            }
        })
    }
}

/// The elements of a serialized `vector<float, n>` (packed big-endian floats, as the
/// native protocol and the storage write them).
pub fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|chunk| f32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
        .collect()
}

/// True when a vector has no cosine similarity with anything (every element zero).
pub fn is_zero(vector: &[f32]) -> bool {
    vector.iter().all(|x| *x == 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_are_cassandras() {
        let a = [1.0, 0.0];
        let b = [0.0, 1.0];
        assert_eq!(Similarity::Cosine.score(&a, &a), Ok(1.0));
        assert_eq!(Similarity::Cosine.score(&a, &b), Ok(0.5));
        assert_eq!(Similarity::Cosine.score(&a, &[-1.0, 0.0]), Ok(0.0));
        assert_eq!(Similarity::Euclidean.score(&a, &b), Ok(1.0 / 3.0));
        assert_eq!(Similarity::Euclidean.score(&a, &a), Ok(1.0));
        assert_eq!(Similarity::DotProduct.score(&a, &a), Ok(1.0));
        assert_eq!(Similarity::DotProduct.score(&a, &b), Ok(0.5));
    }

    #[test]
    fn cosine_of_a_zero_vector_and_mismatched_dimensions_have_no_score() {
        assert_eq!(
            Similarity::Cosine.score(&[0.0, 0.0], &[1.0, 2.0]),
            Err(SimilarityError::ZeroVector)
        );
        assert_eq!(
            Similarity::Euclidean.score(&[0.0], &[1.0, 2.0]),
            Err(SimilarityError::Dimensions { left: 1, right: 2 })
        );
        assert_eq!(
            Similarity::named("DOT_PRODUCT"),
            Some(Similarity::DotProduct)
        );
        assert_eq!(Similarity::named("manhattan"), None);
    }
}
