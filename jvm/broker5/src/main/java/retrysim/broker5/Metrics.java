package retrysim.broker5;

import io.opentelemetry.api.common.Attributes;
import io.opentelemetry.api.metrics.DoubleHistogram;
import io.opentelemetry.exporter.prometheus.PrometheusHttpServer;
import io.opentelemetry.sdk.metrics.Aggregation;
import io.opentelemetry.sdk.metrics.InstrumentSelector;
import io.opentelemetry.sdk.metrics.SdkMeterProvider;
import io.opentelemetry.sdk.metrics.View;
import io.opentelemetry.sdk.resources.Resource;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.List;
import retrysim.harness.Children;
import retrysim.harness.Listener;

/**
 * metrics=true: the broker's Prometheus endpoint (BrokerConfig metricsExporterType=PROM on a
 * free loopback port; in local mode the proxy's own series go to the broker's meter, so it
 * serves them too), and one of this JVM's own with the gRPC client's rocketmq_process_time
 * histogram (its buckets and labels, client_id aside) as the harness measures each push
 * delivery's listener time: the client's own histogram leaves it only by OTLP, for a collector
 * the proxy names (metricCollectorMode), and the proxy keeps none. The endpoints are written
 * to metrics-endpoints.txt ({@code name url} a line) once the proxy is up; production waits
 * for the scraper to write scrape-ready beside it.
 */
final class Metrics {
  static final String PROCESS_TIME = "rocketmq_process_time";
  // HistogramEnum.PROCESS_TIME of rocketmq-client-java 5.2.0, ms
  private static final List<Double> BUCKETS =
      List.of(1.0, 5.0, 10.0, 100.0, 1_000.0, 10_000.0, 60_000.0);
  private static final long SCRAPER_MS = 60_000; // how long production waits for the scraper

  private final Path out;
  private final int brokerPort = Children.freePort();
  private final int harnessPort = Children.freePort();
  private final DoubleHistogram processTime;
  private final Attributes success;
  private final Attributes failure;

  Metrics(Path out, String topic, String group) throws IOException {
    this.out = out;
    SdkMeterProvider provider = SdkMeterProvider.builder()
        .setResource(Resource.empty())
        .registerMetricReader(
            PrometheusHttpServer.builder().setHost("127.0.0.1").setPort(harnessPort).build())
        .registerView(InstrumentSelector.builder().setName(PROCESS_TIME).build(),
            View.builder().setAggregation(Aggregation.explicitBucketHistogram(BUCKETS)).build())
        .build();
    processTime = provider.get("retrysim-harness").histogramBuilder(PROCESS_TIME).build();
    Attributes labels = Attributes.builder().put("topic", topic).put("consumer_group", group)
        .build();
    success = labels.toBuilder().put("invocation_status", "success").build();
    failure = labels.toBuilder().put("invocation_status", "failure").build();
  }

  /** broker.conf's lines: the broker's Prometheus exporter on loopback. */
  List<String> brokerConfig() {
    return List.of("metricsExporterType=PROM", "metricsPromExporterHost=127.0.0.1",
        "metricsPromExporterPort=" + brokerPort);
  }

  /**
   * rmq-proxy.json's keys: its exporter on, so that local mode registers rocketmq_proxy_up on
   * the broker's meter (its own server starts in cluster mode only; its port is a free one).
   */
  String proxyConfig() throws IOException {
    return "\"metricsExporterType\": \"PROM\", \"metricsPromExporterHost\": \"127.0.0.1\","
        + " \"metricsPromExporterPort\": " + Children.freePort() + ",";
  }

  /** metrics-endpoints.txt, whole at once. */
  void writeEndpoints() throws IOException {
    Path written = out.resolve("metrics-endpoints.txt.part");
    Files.write(written, List.of("broker http://127.0.0.1:" + brokerPort + "/metrics",
        "harness http://127.0.0.1:" + harnessPort + "/metrics"));
    Files.move(written, out.resolve("metrics-endpoints.txt"), StandardCopyOption.ATOMIC_MOVE);
  }

  /** Back once the scraper has written scrape-ready. */
  void awaitScraper() {
    long deadline = System.currentTimeMillis() + SCRAPER_MS;
    while (!Files.exists(out.resolve("scrape-ready"))) {
      if (System.currentTimeMillis() > deadline) {
        throw new IllegalStateException("metrics: no scrape-ready in " + out + " within "
            + SCRAPER_MS / 1000 + " s");
      }
      Listener.sleep(50);
    }
  }

  /** One push delivery's listener time, as the client records it (whole ms). */
  void processTime(long nanos, String outcome) {
    processTime.record(nanos / 1_000_000, outcome.equals("CONSUME_SUCCESS") ? success : failure);
  }
}
