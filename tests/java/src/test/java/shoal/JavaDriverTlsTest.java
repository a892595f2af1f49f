package shoal;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import com.datastax.oss.driver.api.core.AllNodesFailedException;
import com.datastax.oss.driver.api.core.CqlSession;
import com.datastax.oss.driver.api.core.CqlSessionBuilder;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.CertificateFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The Java driver over TLS (required on the CQL port) with a password login. */
class JavaDriverTlsTest {
  static ShoalProcess shoal;
  /** The certificate, its key and the node's configuration. */
  static Path directory;
  static Path certificate;

  @BeforeAll
  static void startShoal() throws Exception {
    directory = Files.createTempDirectory("shoal-java-tls");
    certificate = directory.resolve("node.crt");
    Path key = directory.resolve("node.key");
    Process openssl = new ProcessBuilder("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", "/CN=shoal",
        "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key.toString(),
        "-out", certificate.toString()).redirectErrorStream(true).start();
    openssl.getInputStream().readAllBytes();
    assertEquals(0, openssl.waitFor());
    Path config = directory.resolve("tls.toml");
    Files.writeString(config, "client_tls = \"required\"\ntls_certificate = \"" + certificate
        + "\"\ntls_private_key = \"" + key + "\"\n");
    shoal = ShoalProcess.start("--config", config.toString(), "--auth");
  }

  @AfterAll
  static void stopShoal() throws Exception {
    if (shoal != null) {
      shoal.close();
    }
    if (directory != null) {
      ShoalProcess.deleteTree(directory);
    }
  }

  static SSLContext trusting(Path trusted) throws Exception {
    KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
    store.load(null, null);
    try (InputStream in = Files.newInputStream(trusted)) {
      store.setCertificateEntry("shoal", CertificateFactory.getInstance("X.509").generateCertificate(in));
    }
    TrustManagerFactory trust = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
    trust.init(store);
    SSLContext context = SSLContext.getInstance("TLS");
    context.init(null, trust.getTrustManagers(), null);
    return context;
  }

  static CqlSessionBuilder builder() {
    return CqlSession.builder()
        .addContactPoint(new InetSocketAddress("127.0.0.1", shoal.port))
        .withLocalDatacenter("datacenter1")
        .withAuthCredentials("cassandra", "cassandra");
  }

  @Test
  void connectsOverTlsWhenItTrustsTheCertificate() throws Exception {
    try (CqlSession session = builder().withSslContext(trusting(certificate)).build()) {
      assertEquals("local", session.execute("SELECT key FROM system.local").one().getString("key"));
    }
    assertThrows(AllNodesFailedException.class, () -> builder().build());
    assertThrows(AllNodesFailedException.class,
        () -> builder().withSslContext(SSLContext.getDefault()).build());
  }
}
