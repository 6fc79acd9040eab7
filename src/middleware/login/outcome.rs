//! [`LoginOutcome`]: what a login response says about the attempt.

use http::StatusCode;

#[cfg(doc)]
use crate::login::LoginGuard;

/// What a login response says about the attempt, as
/// [`LoginLayer::classify`](super::LoginLayer::classify) reads it from the status.
///
/// # Examples
///
/// ```
/// use http::StatusCode;
/// use tollgate::middleware::LoginOutcome;
///
/// assert_eq!(LoginOutcome::from_status(StatusCode::UNAUTHORIZED), LoginOutcome::Failure);
/// assert_eq!(LoginOutcome::from_status(StatusCode::OK), LoginOutcome::Success);
/// assert_eq!(LoginOutcome::from_status(StatusCode::BAD_REQUEST), LoginOutcome::Ignore);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoginOutcome {
    /// A wrong password: [`LoginGuard::record_failure`].
    Failure,
    /// A right password: [`LoginGuard::record_success`] (the client becomes known).
    Success,
    /// Neither (a malformed request, a server error): nothing is recorded.
    Ignore,
}

impl LoginOutcome {
    /// The default classification: `401` and `403` are failures, any `2xx` a success,
    /// anything else ignored.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::middleware::LoginOutcome;
    ///
    /// assert_eq!(LoginOutcome::from_status(StatusCode::FORBIDDEN), LoginOutcome::Failure);
    /// assert_eq!(LoginOutcome::from_status(StatusCode::NO_CONTENT), LoginOutcome::Success);
    /// ```
    #[must_use]
    pub fn from_status(status: StatusCode) -> Self {
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => LoginOutcome::Failure,
            status if status.is_success() => LoginOutcome::Success,
            _ => LoginOutcome::Ignore,
        }
    }

    /// How a gRPC response is classified, from its `grpc-status` code: `UNAUTHENTICATED`
    /// (16) and `PERMISSION_DENIED` (7) are failures, `OK` (0) a success, anything else
    /// ignored. A gRPC response without `grpc-status` in its headers (the status comes in the
    /// trailers, after the body) is ignored: its HTTP status is 200 whatever happened.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::LoginOutcome;
    ///
    /// assert_eq!(LoginOutcome::from_grpc_status(Some("16")), LoginOutcome::Failure);
    /// assert_eq!(LoginOutcome::from_grpc_status(Some("0")), LoginOutcome::Success);
    /// assert_eq!(LoginOutcome::from_grpc_status(None), LoginOutcome::Ignore);
    /// ```
    #[must_use]
    pub fn from_grpc_status(code: Option<&str>) -> Self {
        match code.map(str::trim) {
            Some("16" | "7") => LoginOutcome::Failure,
            Some("0") => LoginOutcome::Success,
            _ => LoginOutcome::Ignore,
        }
    }
}
