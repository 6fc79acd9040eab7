//! A scripted upstream: a tower service that answers each call from a script, after a
//! delay, and records when each call arrived.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tower_service::Service;

/// One scripted answer: status, header fields, and the delays before the call arrives and
/// before its answer leaves.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub fields: Vec<(&'static str, String)>,
    pub arrive_after: Duration,
    pub answer_after: Duration,
    /// Whether the call is on the wire once made: it arrives even if its caller drops it
    /// first, as a request already written to a socket does.
    pub on_the_wire: bool,
}

impl Answer {
    pub fn ok() -> Self {
        Answer {
            status: StatusCode::OK,
            fields: Vec::new(),
            arrive_after: Duration::ZERO,
            answer_after: Duration::ZERO,
            on_the_wire: false,
        }
    }

    /// The call arrives even if its caller drops it first.
    pub fn on_the_wire(mut self) -> Self {
        self.on_the_wire = true;
        self
    }

    pub fn status(mut self, status: u16) -> Self {
        self.status = StatusCode::from_u16(status).unwrap();
        self
    }

    pub fn field(mut self, name: &'static str, value: &str) -> Self {
        self.fields.push((name, value.to_owned()));
        self
    }

    pub fn delays(mut self, arrive: Duration, answer: Duration) -> Self {
        self.arrive_after = arrive;
        self.answer_after = answer;
        self
    }
}

/// The upstream: answers from `script` in order, then `then` for every later call.
#[derive(Clone)]
pub struct Upstream {
    script: Arc<Mutex<VecDeque<Answer>>>,
    then: Arc<dyn Fn(usize) -> Answer + Send + Sync>,
    /// When each call arrived.
    arrivals: Arc<Mutex<Vec<Instant>>>,
    start: Instant,
}

impl Upstream {
    pub fn new(
        script: Vec<Answer>,
        then: impl Fn(usize) -> Answer + Send + Sync + 'static,
    ) -> Self {
        Upstream {
            script: Arc::new(Mutex::new(script.into())),
            then: Arc::new(then),
            arrivals: Arc::default(),
            start: Instant::now(),
        }
    }

    /// When each call arrived, from the upstream's start.
    pub fn arrived(&self) -> Vec<Duration> {
        let arrivals = self.arrivals.lock().unwrap();
        arrivals.iter().map(|at| *at - self.start).collect()
    }
}

impl Service<Request<()>> for Upstream {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<()>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        let arrivals = Arc::clone(&self.arrivals);
        let calls = arrivals.lock().unwrap().len();
        let answer = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| (self.then)(calls));
        let arrived = if answer.on_the_wire {
            let (arrive_after, wire) = (answer.arrive_after, Arc::clone(&arrivals));
            Some(tokio::spawn(async move {
                tokio::time::sleep(arrive_after).await;
                wire.lock().unwrap().push(Instant::now());
            }))
        } else {
            None
        };
        Box::pin(async move {
            match arrived {
                Some(arrived) => arrived.await.unwrap(),
                None => {
                    tokio::time::sleep(answer.arrive_after).await;
                    arrivals.lock().unwrap().push(Instant::now());
                }
            }
            tokio::time::sleep(answer.answer_after).await;
            let mut response = Response::builder().status(answer.status);
            for (name, value) in &answer.fields {
                response = response.header(*name, value.as_str());
            }
            Ok(response.body(()).unwrap())
        })
    }
}

/// A request to `host`.
pub fn get(host: &str) -> Request<()> {
    Request::get(format!("https://{host}/v1/items"))
        .body(())
        .unwrap()
}
